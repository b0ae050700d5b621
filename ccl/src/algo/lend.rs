//! How a rank's steps share the call's memory with connections that copy
//! anyway (sockets, whose kernel copies what they send and receive), worked
//! out once per plan from the schedule and its layout:
//!
//! - a send may go from where its memory lies instead of through a slot
//!   ([`SendMode::Lend`]) when no step writes that memory afterwards;
//! - a send whose memory a later step writes may go so too, holding a slot
//!   for it ([`SendMode::Hold`]): each step that writes such memory first
//!   takes back, into that slot, whatever is still unsent ([`Lending::takes_back`]);
//! - a receive may be read straight into its destination
//!   ([`Lending::lands`]) when no other channel touches that memory and an
//!   earlier step of its own has (so the memory is in the cache, and the
//!   copy out of a slot is saved).
//!
//! The verifier proves the marks: no step writes memory lent and not held,
//! a write of held memory takes it back, a landing destination is touched
//! by no other channel and by no lent memory not taken back. The measured
//! worth of each is in `bench/results/tcp-lending.md`.

use super::{Layout, Region, Schedule, Step};

/// Steps of a schedule beyond which it is not analysed (each step is
/// compared with every other): sends hold, writes take back, nothing
/// lands, and set-up stays linear.
pub const MAX_ANALYSED: usize = 4096;

/// How a step's send uses a connection that can send from the call's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendMode {
    /// Through a slot: the step sends nothing of the call's memory as it lies.
    Slot,
    /// From where the memory lies: no step writes it afterwards.
    Lend,
    /// From where it lies, holding a slot that writers take it back into.
    Hold,
}

/// The marks of one rank's schedule, per channel, per step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lending {
    /// How each step sends.
    pub send: Vec<Vec<SendMode>>,
    /// Whether the step first takes back held memory it writes (or lands in).
    pub takes_back: Vec<Vec<bool>>,
    /// Whether what the step receives may be read straight into its destination.
    pub lands: Vec<Vec<bool>>,
}

/// The region a step copies what it receives into, unchanged (a receive,
/// or a receive passed on): where a landing message goes.
pub fn landing(st: &Step) -> Option<Region> {
    match *st {
        Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => Some(dst),
        _ => None,
    }
}

/// The marks of schedule `s` on layout `l`.
pub fn plan(s: &Schedule, l: &Layout) -> Lending {
    if s.channels.iter().map(Vec::len).sum::<usize>() > MAX_ANALYSED {
        let hold = |st: &Step| if st.sends_as_is().is_some() { SendMode::Hold } else { SendMode::Slot };
        return Lending {
            send: s.channels.iter().map(|ch| ch.iter().map(hold).collect()).collect(),
            takes_back: per_step(s, |_, _, st| st.writes().is_some()),
            lands: per_step(s, |_, _, _| false),
        };
    }
    let writes = regions(s, l, Step::writes);
    let send = s
        .channels
        .iter()
        .enumerate()
        .map(|(c, ch)| {
            ch.iter()
                .enumerate()
                .map(|(i, st)| match st.sends_as_is().map(|r| l.resolve(r)) {
                    None => SendMode::Slot,
                    Some(r) if writes.iter().any(|&(wc, wi, w)| may_meet((c, i), (wc, wi)) && w.overlaps(&r)) => {
                        SendMode::Hold
                    }
                    Some(_) => SendMode::Lend,
                })
                .collect()
        })
        .collect::<Vec<Vec<_>>>();
    let mut held = regions(s, l, Step::sends_as_is);
    held.retain(|&(c, i, _)| send[c][i] == SendMode::Hold);
    // a step takes back what it writes, or (landing) what it is given as a place
    let takes_back = per_step(s, |wc, wi, st| {
        st.writes()
            .map(|w| l.resolve(w))
            .is_some_and(|w| held.iter().any(|&(c, i, r)| may_meet((c, i), (wc, wi)) && w.overlaps(&r)))
    });
    let mut touched = writes;
    for (c, ch) in s.channels.iter().enumerate() {
        for (i, st) in ch.iter().enumerate() {
            touched.extend(st.reads().into_iter().map(|r| (c, i, l.resolve(r))));
        }
    }
    let lands = per_step(s, |c, i, st| {
        landing(st).map(|d| l.resolve(d)).is_some_and(|d| {
            let meets = |(tc, ti, r): &(usize, usize, Region)| r.overlaps(&d) && (*tc != c || *ti < i);
            !touched.iter().any(|t| t.0 != c && meets(t)) && touched.iter().any(|t| t.0 == c && meets(t))
        })
    });
    Lending { send, takes_back, lands }
}

/// Every step's region that `pick` names, resolved, with its channel and
/// position.
fn regions(s: &Schedule, l: &Layout, pick: impl Fn(&Step) -> Option<Region>) -> Vec<(usize, usize, Region)> {
    let pick = &pick;
    s.channels
        .iter()
        .enumerate()
        .flat_map(|(c, ch)| ch.iter().enumerate().filter_map(move |(i, st)| Some((c, i, l.resolve(pick(st)?)))))
        .collect()
}

/// `f(channel, position, step)` for every step, in the schedule's shape.
fn per_step(s: &Schedule, f: impl Fn(usize, usize, &Step) -> bool) -> Vec<Vec<bool>> {
    s.channels.iter().enumerate().map(|(c, ch)| ch.iter().enumerate().map(|(i, st)| f(c, i, st)).collect()).collect()
}

/// Whether step `w` may write while step `send` is still sending: it is
/// another channel's, or later in the same one.
fn may_meet(send: (usize, usize), w: (usize, usize)) -> bool {
    !(w.0 == send.0 && w.1 <= send.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{generate, Algo, Coll, Params};
    use crate::topo::Hosts;

    fn sched(coll: Coll, algo: Algo, n: usize, rank: usize, count: usize, in_place: bool, hosts: &Hosts) -> Schedule {
        let p = Params { nranks: n, rank, count, root: n / 2, channels: 2, chunk: 5, in_place, around: false, hosts, blocks: None };
        generate(coll, algo, &p).expect("schedule")
    }

    fn lendable(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
        plan(s, l).send.iter().map(|ch| ch.iter().map(|&m| m == SendMode::Lend).collect()).collect()
    }

    /// The steps that take back, given the sends that lend unheld (`safe`,
    /// which must be what `plan` found).
    fn guards(s: &Schedule, l: &Layout, safe: &[Vec<bool>]) -> Vec<Vec<bool>> {
        assert_eq!(safe, lendable(s, l));
        plan(s, l).takes_back
    }

    fn lands(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
        plan(s, l).lands
    }

    /// The elements of a resolved region, each with its buffer.
    fn elems(r: Region) -> impl Iterator<Item = (crate::algo::Buf, usize)> {
        (r.off..r.off + r.len).map(move |e| (r.buf, e))
    }

    /// Element by element: the memory a step sends, and every element
    /// written by another channel or later in its own.
    fn reference(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
        let mut out = Vec::new();
        for (c, ch) in s.channels.iter().enumerate() {
            let mut row = Vec::new();
            for (i, st) in ch.iter().enumerate() {
                row.push(st.sends_as_is().is_some_and(|r| {
                    let mine: std::collections::HashSet<_> = elems(l.resolve(r)).collect();
                    s.channels.iter().enumerate().all(|(c2, ch2)| {
                        ch2.iter().enumerate().filter(|&(i2, _)| c2 != c || i2 > i).all(|(_, st2)| {
                            st2.writes().is_none_or(|w| elems(l.resolve(w)).all(|e| !mine.contains(&e)))
                        })
                    })
                }));
            }
            out.push(row);
        }
        out
    }

    /// Element by element: the steps that write an element which a send
    /// not in `safe` (another channel's, or an earlier one of their own) sends.
    fn reference_guards(s: &Schedule, l: &Layout, safe: &[Vec<bool>]) -> Vec<Vec<bool>> {
        s.channels
            .iter()
            .enumerate()
            .map(|(wc, ch)| {
                ch.iter()
                    .enumerate()
                    .map(|(wi, st)| {
                        let Some(w) = st.writes() else { return false };
                        let mine: std::collections::HashSet<_> = elems(l.resolve(w)).collect();
                        s.channels.iter().enumerate().any(|(c, ch2)| {
                            ch2.iter().enumerate().any(|(i, st2)| {
                                !(safe[c][i] || wc == c && wi <= i)
                                    && st2.sends_as_is().is_some_and(|r| elems(l.resolve(r)).any(|e| mine.contains(&e)))
                            })
                        })
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn schedules_too_long_to_analyse_lend_nothing_unheld_and_land_nothing() {
        let hosts = Hosts::flat(4);
        let p = Params { nranks: 4, rank: 1, count: 1 << 14, root: 0, channels: 1, chunk: 1, in_place: true, around: false, hosts: &hosts, blocks: None };
        let s = generate(Coll::AllReduce, Algo::Ring, &p).expect("schedule");
        assert!(s.channels[0].len() > MAX_ANALYSED);
        let m = plan(&s, &Coll::AllReduce.layout(4, 1, 1 << 14, 0, true));
        assert!(m.send[0].iter().all(|&x| x != SendMode::Lend) && m.lands[0].iter().all(|&b| !b));
        assert!(m.takes_back[0].iter().zip(&s.channels[0]).all(|(&t, st)| t == st.writes().is_some()));
    }

    #[test]
    fn steps_send_from_the_buffers_only_what_nothing_writes_afterwards() {
        for coll in Coll::ALL {
            for algo in coll.algos().iter().copied() {
                for n in 1..=9 {
                    for hosts in [Hosts::flat(n), Hosts::blocks(&vec![1; n])] {
                        for in_place in [false, true] {
                            for rank in 0..n {
                                let count = 23;
                                let s = sched(coll, algo, n, rank, count, in_place, &hosts);
                                let l = coll.layout(n, rank, count, n / 2, in_place);
                                let safe = lendable(&s, &l);
                                assert_eq!(safe, reference(&s, &l), "{coll} {algo} n={n} rank {rank}");
                                let g = guards(&s, &l, &safe);
                                assert_eq!(g, reference_guards(&s, &l, &safe), "{coll} {algo} n={n} rank {rank}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Element by element: the steps that copy what they receive into
    /// memory no other channel's step reads or writes, and that an earlier
    /// step of their own channel reads or writes.
    fn reference_lands(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
        let touched = |st: &Step| {
            let regs: Vec<Region> = st.reads().into_iter().chain(st.writes()).collect();
            regs.into_iter().flat_map(|r| elems(l.resolve(r))).collect::<std::collections::HashSet<_>>()
        };
        let mut out = Vec::new();
        for (c, ch) in s.channels.iter().enumerate() {
            let mut row = Vec::new();
            for (i, st) in ch.iter().enumerate() {
                row.push(match st {
                    Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => {
                        let mine: Vec<_> = elems(l.resolve(*dst)).collect();
                        let others = s.channels.iter().enumerate().filter(|&(o, _)| o != c).flat_map(|(_, ch2)| ch2);
                        let others_touch = others.map(touched).any(|t| mine.iter().any(|e| t.contains(e)));
                        let earlier = ch[..i].iter().map(touched).any(|t| mine.iter().any(|e| t.contains(e)));
                        !others_touch && earlier
                    }
                    _ => false,
                });
            }
            out.push(row);
        }
        out
    }

    #[test]
    fn receives_land_in_place_only_where_no_other_channel_touches_the_memory() {
        let mut landed = 0;
        for coll in Coll::ALL {
            for algo in coll.algos().iter().copied() {
                for n in 1..=9 {
                    for in_place in [false, true] {
                        for rank in 0..n {
                            let hosts = Hosts::flat(n);
                            let s = sched(coll, algo, n, rank, 23, in_place, &hosts);
                            let l = coll.layout(n, rank, 23, n / 2, in_place);
                            let got = lands(&s, &l);
                            assert_eq!(got, reference_lands(&s, &l), "{coll} {algo} n={n} rank {rank}");
                            landed += got.iter().flatten().filter(|&&f| f).count();
                        }
                    }
                }
            }
        }
        assert!(landed > 0, "some receives land in place");
        // every gathering receive of a 2-rank ring all-reduce lands in
        // place (what the rank sent from there is taken back first), none
        // out of place (into output the call has not touched yet)
        for in_place in [false, true] {
            let s = sched(Coll::AllReduce, Algo::Ring, 2, 0, 40, in_place, &Hosts::flat(2));
            let l = Coll::AllReduce.layout(2, 0, 40, 0, in_place);
            let got = lands(&s, &l);
            let recvs: Vec<bool> = s
                .channels
                .iter()
                .zip(&got)
                .flat_map(|(ch, f)| ch.iter().zip(f))
                .filter(|(st, _)| landing(st).is_some())
                .map(|(_, &f)| f)
                .collect();
            assert!(!recvs.is_empty() && recvs.iter().all(|&f| f == in_place), "in place {in_place}: {recvs:?}");
        }
    }

    #[test]
    fn a_ring_all_reduce_sends_from_its_buffers_all_it_can() {
        let hosts = Hosts::flat(2);
        let count = 40;
        let sends = |in_place: bool| {
            let s = sched(Coll::AllReduce, Algo::Ring, 2, 0, count, in_place, &hosts);
            let l = Coll::AllReduce.layout(2, 0, count, 0, in_place);
            let flags = lendable(&s, &l);
            s.channels
                .iter()
                .zip(&flags)
                .flat_map(|(ch, f)| ch.iter().zip(f))
                .filter(|(st, _)| st.send_peer().is_some())
                .map(|(_, &f)| f)
                .collect::<Vec<bool>>()
        };
        // out of place: the input is never written, nor a result once sent
        let out = sends(false);
        assert!(!out.is_empty() && out.iter().all(|&f| f), "{out:?}");
        // in place: a piece sent while reducing is received into later
        // (the all-gather half), a piece sent while gathering is final
        let inp = sends(true);
        assert!(inp.iter().any(|&f| f) && inp.iter().any(|&f| !f), "{inp:?}");
        // recursive doubling in place reduces into what it has just sent
        let s = sched(Coll::AllReduce, Algo::RecursiveDoubling, 2, 0, count, true, &hosts);
        let l = Coll::AllReduce.layout(2, 0, count, 0, true);
        assert!(lendable(&s, &l).iter().flatten().all(|&f| !f));
        // sends that are written afterwards lend all the same, and only the
        // steps that write their memory take it back first: in place, the
        // ring's last receive of each channel (the piece it sent first)
        let writes_back = |in_place: bool| {
            let s = sched(Coll::AllReduce, Algo::Ring, 2, 0, count, in_place, &hosts);
            let l = Coll::AllReduce.layout(2, 0, count, 0, in_place);
            let g = guards(&s, &l, &lendable(&s, &l));
            s.channels
                .iter()
                .zip(&g)
                .flat_map(|(ch, g)| ch.iter().zip(g))
                .filter(|(_, &g)| g)
                .map(|(st, _)| matches!(st, Step::Recv { .. }))
                .collect::<Vec<bool>>()
        };
        assert!(writes_back(false).is_empty());
        let inp = writes_back(true);
        assert!(!inp.is_empty() && inp.iter().all(|&r| r), "{inp:?}");
    }
}
