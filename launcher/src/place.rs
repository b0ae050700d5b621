//! Placement: which host each rank runs on, and its local rank there.

use crate::hostfile::HostSlots;

/// How ranks are spread over hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MapBy {
    /// Fill each host's slots in order.
    Slot,
    /// Round robin over hosts.
    Node,
}

/// Where one rank runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Index into the host list.
    pub host: usize,
    /// Rank among the ranks of that host.
    pub local_rank: usize,
    /// Ranks on that host.
    pub local_size: usize,
}

/// Places `np` ranks. More ranks than slots is an error unless
/// `oversubscribe`; `max_slots` is never exceeded.
pub fn place(hosts: &[HostSlots], np: usize, by: MapBy, oversubscribe: bool) -> Result<Vec<usize>, String> {
    let slots = hosts.iter().fold(0usize, |a, h| a.saturating_add(h.slots));
    if np > slots && !oversubscribe {
        return Err(format!(
            "{np} ranks requested but the hosts have {slots} slot(s); add slots or pass --oversubscribe"
        ));
    }
    let cap = |h: &HostSlots| h.max_slots.unwrap_or(usize::MAX);
    let max_total = hosts.iter().fold(0usize, |a, h| a.saturating_add(cap(h).min(np)));
    if np > max_total {
        return Err(format!("{np} ranks requested but max_slots allows {max_total}"));
    }
    let mut out = Vec::with_capacity(np);
    // phase 1: within the slots, by slot (fill each host) or by node (rotate)
    match by {
        MapBy::Slot => {
            for (i, h) in hosts.iter().enumerate() {
                out.extend(std::iter::repeat_n(i, h.slots.min(np - out.len())));
            }
        }
        MapBy::Node => round_robin(hosts, np, &mut out, |h| h.slots),
    }
    // phase 2: oversubscribing, round robin up to each host's max_slots
    round_robin(hosts, np, &mut out, cap);
    if out.len() < np {
        return Err(format!("could place only {} of {np} ranks", out.len()));
    }
    Ok(out)
}

/// Adds ranks to hosts in turn while `limit` allows, until `np` are placed.
fn round_robin(hosts: &[HostSlots], np: usize, out: &mut Vec<usize>, limit: impl Fn(&HostSlots) -> usize) {
    let mut count = vec![0usize; hosts.len()];
    for &h in out.iter() {
        count[h] += 1;
    }
    loop {
        let before = out.len();
        for (i, h) in hosts.iter().enumerate() {
            if out.len() < np && count[i] < limit(h) {
                count[i] += 1;
                out.push(i);
            }
        }
        if out.len() == np || out.len() == before {
            return;
        }
    }
}

/// Local ranks and sizes for a rank → host map.
pub fn locals(host_of: &[usize], nhosts: usize) -> Vec<Placement> {
    let mut size = vec![0usize; nhosts];
    for &h in host_of {
        size[h] += 1;
    }
    let mut next = vec![0usize; nhosts];
    host_of
        .iter()
        .map(|&h| {
            next[h] += 1;
            Placement { host: h, local_rank: next[h] - 1, local_size: size[h] }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(slots: &[usize]) -> Vec<HostSlots> {
        slots.iter().enumerate().map(|(i, &s)| HostSlots { name: format!("h{i}"), slots: s, max_slots: None }).collect()
    }

    #[test]
    fn by_slot_fills_by_node_rotates() {
        assert_eq!(place(&hosts(&[2, 2]), 4, MapBy::Slot, false).expect("ok"), vec![0, 0, 1, 1]);
        assert_eq!(place(&hosts(&[2, 2]), 4, MapBy::Node, false).expect("ok"), vec![0, 1, 0, 1]);
        assert_eq!(place(&hosts(&[2, 1]), 3, MapBy::Node, false).expect("ok"), vec![0, 1, 0]);
        let l = locals(&[0, 1, 0], 2);
        assert_eq!((l[2].local_rank, l[2].local_size, l[1].local_size), (1, 2, 1));
    }

    #[test]
    fn huge_slot_counts_do_not_overflow() {
        let big = |n: &str| HostSlots { name: n.into(), slots: usize::MAX, max_slots: Some(usize::MAX) };
        assert_eq!(place(&[big("a"), big("b")], 3, MapBy::Node, false).expect("fits"), vec![0, 1, 0]);
    }

    #[test]
    fn oversubscription_is_explicit_and_bounded() {
        assert!(place(&hosts(&[1, 1]), 3, MapBy::Slot, false).expect_err("too many").contains("--oversubscribe"));
        assert_eq!(place(&hosts(&[1, 1]), 4, MapBy::Slot, true).expect("ok").len(), 4);
        let capped = vec![HostSlots { name: "a".into(), slots: 1, max_slots: Some(2) }];
        assert!(place(&capped, 3, MapBy::Slot, true).is_err());
        assert_eq!(place(&capped, 2, MapBy::Slot, true).expect("ok"), vec![0, 0]);
    }
}
