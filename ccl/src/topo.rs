//! Topology: which ranks share a host, and the ring order that enters and
//! leaves each host once.

use std::collections::HashMap;
use std::hash::Hash;

/// Ranks grouped by host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hosts {
    /// Host index (0..hosts, in order of first appearance) of each rank.
    host_of: Vec<usize>,
    /// Ranks of each host, ascending (kept: every rank's schedule asks).
    groups: Vec<Vec<usize>>,
    /// The groups one after the other.
    ring: Vec<usize>,
    /// Each rank's place in `ring`.
    pos: Vec<usize>,
}

impl Hosts {
    /// Hosts of `host_of` (indices in order of first appearance).
    fn new(host_of: Vec<usize>) -> Self {
        let nh = host_of.iter().max().map_or(0, |m| m + 1);
        let mut groups = vec![Vec::new(); nh];
        for (r, &h) in host_of.iter().enumerate() {
            groups[h].push(r);
        }
        let ring = groups.concat();
        let mut pos = vec![0; ring.len()];
        for (i, &r) in ring.iter().enumerate() {
            pos[r] = i;
        }
        Hosts { host_of, groups, ring, pos }
    }

    /// All `n` ranks on one host.
    pub fn flat(n: usize) -> Self {
        Hosts::new(vec![0; n])
    }

    /// Groups ranks by any host identity (`ids[rank]`).
    pub fn from_ids<K: Eq + Hash + Clone>(ids: &[K]) -> Self {
        let mut index: HashMap<K, usize> = HashMap::new();
        let host_of = ids
            .iter()
            .map(|k| {
                let next = index.len();
                *index.entry(k.clone()).or_insert(next)
            })
            .collect();
        Hosts::new(host_of)
    }

    /// `sizes[h]` consecutive ranks on host `h`.
    pub fn blocks(sizes: &[usize]) -> Self {
        Hosts::new(sizes.iter().enumerate().flat_map(|(h, &s)| std::iter::repeat_n(h, s)).collect())
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    /// The host index of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of.get(rank).copied().unwrap_or(0)
    }

    /// How many ranks each host has, hosts in order of first appearance.
    pub fn sizes(&self) -> Vec<usize> {
        self.groups.iter().map(Vec::len).collect()
    }

    /// Ranks of each host, ascending, hosts in order of first appearance.
    pub fn groups(&self) -> &[Vec<usize>] {
        &self.groups
    }

    /// The ring order: host by host, ranks ascending within a host, so the
    /// ring crosses each host boundary once.
    pub fn ring(&self) -> &[usize] {
        &self.ring
    }

    /// `rank`'s place in the [`ring`](Self::ring).
    pub fn ring_pos(&self, rank: usize) -> usize {
        self.pos.get(rank).copied().unwrap_or(0)
    }

    /// The ring of channel `channel`: host by host as [`ring`](Self::ring),
    /// but each host's ranks rotated to start at its `channel`-th (modulo
    /// its size), so that channel `c` enters a host at local rank `c` and
    /// leaves it from local rank `c - 1`: with a NIC per local rank, as many
    /// channels as ranks per host cross between hosts through as many
    /// NICs, where the plain ring sends every channel through one.
    /// On one host the rotation would only renumber the places, so it is
    /// the plain ring there.
    pub fn channel_ring(&self, channel: usize) -> Vec<usize> {
        if self.groups.len() < 2 {
            return self.ring.clone();
        }
        self.groups.iter().flat_map(|g| g.iter().cycle().skip(channel % g.len()).take(g.len()).copied()).collect()
    }

    /// `rank`'s place in the ring of channel `channel`
    /// ([`channel_ring`](Self::channel_ring)).
    pub fn channel_ring_pos(&self, rank: usize, channel: usize) -> usize {
        let pos = self.ring_pos(rank);
        if self.groups.len() < 2 {
            return pos;
        }
        let (local, s) = (self.local(rank), self.groups[self.host_of(rank)].len());
        pos - local + (local + s - channel % s) % s
    }

    /// `rank`'s place on its host: its index among the host's ranks.
    pub fn local(&self, rank: usize) -> usize {
        let g = &self.groups[self.host_of(rank).min(self.groups.len().saturating_sub(1))];
        g.binary_search(&rank).unwrap_or(0)
    }

    /// This communicator's hosts restricted to `members` (new rank `i` is
    /// old rank `members[i]`).
    pub fn subset(&self, members: &[usize]) -> Self {
        Hosts::from_ids(&members.iter().map(|&r| self.host_of(r)).collect::<Vec<_>>())
    }
}

/// Which of `cpus` CPUs cclrun pins local rank `rank` of `ranks` to: the
/// rank-th while there are enough, else contiguous blocks, so that ranks
/// next to each other (ring and recursive-doubling neighbours) share a
/// CPU and only the blocks' ends talk across CPUs
/// (`bench/results/bind-to.md`).
pub fn cpu_of(rank: usize, ranks: usize, cpus: usize) -> usize {
    if ranks <= cpus {
        rank
    } else {
        rank * cpus / ranks
    }
}

/// Whether cclrun's `--bind-to auto` pins `ranks` of a host on its `cpus`
/// CPUs (as [`cpu_of`] places them): where they outnumber the CPUs and
/// split evenly over them (ccl-sim then shares each core by its ranks'
/// work): pinned, such ranks run steadier; pinned unevenly, the ranks
/// sharing a CPU run slower (`bench/results/bind-to.md`). With no more
/// ranks than CPUs, jobs side by side would all pin to the same first CPUs.
pub fn evenly_oversubscribed(ranks: usize, cpus: usize) -> bool {
    cpus > 0 && ranks > cpus && ranks.is_multiple_of(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_visits_each_host_once() {
        let h = Hosts::from_ids(&["a", "b", "a", "c", "b"]);
        assert_eq!(h.groups(), vec![vec![0, 2], vec![1, 4], vec![3]]);
        assert_eq!(h.ring(), vec![0, 2, 1, 4, 3]);
        assert_eq!(Hosts::blocks(&[2, 1]).groups(), vec![vec![0, 1], vec![2]]);
        assert_eq!(h.subset(&[1, 3, 4]).groups(), vec![vec![0, 2], vec![1]]);
    }

    #[test]
    fn each_channel_s_ring_enters_and_leaves_hosts_at_other_local_ranks() {
        let h = Hosts::from_ids(&["a", "b", "a", "c", "b", "a"]);
        assert_eq!(h.channel_ring(0), h.ring());
        assert_eq!(h.channel_ring(1), [2, 5, 0, 4, 1, 3]);
        assert_eq!(h.channel_ring(2), [5, 0, 2, 1, 4, 3]);
        assert_eq!(h.channel_ring(6), h.ring(), "hosts of 3, 2 and 1 all come round");
        for c in 0..7 {
            let ring = h.channel_ring(c);
            for (i, &r) in ring.iter().enumerate() {
                assert_eq!(h.channel_ring_pos(r, c), i, "rank {r} on channel {c}");
            }
        }
        let one = Hosts::flat(5);
        assert_eq!(one.channel_ring(3), one.ring(), "one host: the plain ring");
        assert_eq!(one.channel_ring_pos(4, 3), 4);
    }

    #[test]
    fn auto_pins_only_ranks_that_outnumber_the_cpus_and_split_evenly_over_them() {
        let pinned: Vec<usize> = (1..=9).filter(|&r| evenly_oversubscribed(r, 2)).collect();
        assert_eq!(pinned, [4, 6, 8]);
        assert!(evenly_oversubscribed(64, 2) && evenly_oversubscribed(3, 1));
        assert!(!evenly_oversubscribed(4, 0), "no CPUs known: nothing to pin to");
        // the blocks: 4 ranks on 2 CPUs, 0-1 and 2-3
        assert_eq!((0..4).map(|r| cpu_of(r, 4, 2)).collect::<Vec<_>>(), [0, 0, 1, 1]);
        assert_eq!((0..2).map(|r| cpu_of(r, 2, 4)).collect::<Vec<_>>(), [0, 1]);
    }
}
