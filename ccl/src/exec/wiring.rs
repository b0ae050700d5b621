//! How a schedule uses a communicator's connections, and which of its
//! sends may go straight from the call's buffers: worked out once per plan
//! by its first call, then shared by every later call of it.

use super::Conns;
use crate::algo::{Layout, Region, Schedule, Step};
use crate::error::Result;
use std::sync::Arc;

/// Steps of a schedule beyond which it is not analysed for lending and
/// landing (each step is compared with every other), and sockets copy
/// through their slots: set-up stays linear in the steps.
const MAX_ANALYSED: usize = 4096;

/// Connection indices a step uses: (send, recv).
pub(super) type Link = (Option<usize>, Option<usize>);

/// A schedule's connections on one communicator: found (and made) by the
/// first call of a plan, then shared by every later call of it.
#[derive(Debug)]
pub(super) struct Wiring {
    /// The schedule wired.
    pub(super) sched: Arc<Schedule>,
    /// Per channel, per step: the connections it sends and receives on.
    pub(super) links: Vec<Vec<Link>>,
    /// Every connection used, by [`Conns::send_id`]/[`Conns::recv_id`],
    /// sorted, once each.
    pub(super) uses: Vec<usize>,
    /// Per channel, per step: whether what it sends may be sent from where
    /// it lies in the call's buffers with nothing more to do ([`lendable`]).
    pub(super) lendable: Vec<Vec<bool>>,
    /// Per channel, per step: whether it writes memory that another step
    /// may still be sending from ([`guards`]).
    pub(super) guards: Vec<Vec<bool>>,
    /// Per channel, per step: whether what it receives may be read straight
    /// into the memory it is copied to, from when the step begins ([`lands`]).
    pub(super) lands: Vec<Vec<bool>>,
}

/// The region a step copies what it receives into, unchanged (a receive,
/// or a receive passed on).
pub(super) fn landing(st: &Step) -> Option<Region> {
    match *st {
        Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => Some(dst),
        _ => None,
    }
}

/// Per channel, per step of `s` on `l`: whether the step copies what it
/// receives into memory of the call ([`landing`]) that no other channel's
/// step reads or writes, and that an earlier step of its own has read or
/// written in this call.
///
/// The first makes it safe: from when the step begins until it has taken
/// its last message, nothing but a socket then touches that memory (its
/// own channel's later steps wait for it, and what its earlier ones still
/// send from there is taken back first, as [`guards`] says), so the socket
/// may read the messages straight into it.
///
/// The second makes it pay: memory the call has just used is still in
/// the cache, and reading into it saves the copy out of a slot. Memory
/// not touched yet (a receive into an output apart from the input) the
/// kernel's copy would first read from DRAM, line by line, where the copy
/// out of a slot of a large output streams it out without reading it.
/// Measured on this project's VM (2 ranks over TCP, near placement,
/// medians of 100-400 alternating pairs): landing every receive made
/// out-of-place calls 3-10 % slower at 1-64 MiB; landing as here, in-place
/// calls ran 7 % faster at 64 MiB (16.5 -> 15.3 ms), 2-6 % at 8-16 MiB,
/// and within noise (±4 %) at 8 KiB-4 MiB.
fn lands(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
    let mut touched = regions(s, l, Step::writes);
    for (c, ch) in s.channels.iter().enumerate() {
        for (i, st) in ch.iter().enumerate() {
            touched.extend(st.reads().into_iter().map(|r| (c, i, l.resolve(r))));
        }
    }
    per_step(s, |c, i, st| {
        landing(st).map(|d| l.resolve(d)).is_some_and(|d| {
            let meets = |(tc, ti, r): &(usize, usize, Region)| r.overlaps(&d) && (*tc != c || *ti < i);
            !touched.iter().any(|t| t.0 != c && meets(t)) && touched.iter().any(|t| t.0 == c && meets(t))
        })
    })
}

/// Per channel, per step of `s` on `l`: whether the step sends memory of
/// the call as it is (a send, or the result a step has just written) that
/// no step writes afterwards: no other channel's at any time, none later
/// in its own. Such memory can go to a socket straight from there, and
/// stays as it was until the call ends.
fn lendable(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
    let writes = regions(s, l, Step::writes);
    per_step(s, |c, i, st| {
        st.sends_as_is()
            .map(|r| l.resolve(r))
            .is_some_and(|r| !writes.iter().any(|&(wc, wi, w)| may_meet((c, i), (wc, wi)) && w.overlaps(&r)))
    })
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

/// Per channel, per step of `s` on `l`: whether the step writes memory
/// that a step sending memory of the call as it is, but not [`lendable`]
/// there (`safe`), may still be sending: another channel's step at any
/// time, or an earlier one of its own. Those sends lend the memory all the
/// same, holding a slot for it, and these writes first take back into that
/// slot whatever is still unsent ([`SendConn::reclaim`]). In a ring
/// all-reduce in place, the piece a rank sends first comes back reduced
/// only after its peer has received it, so that write finds it gone and
/// copies nothing.
///
/// [`SendConn::reclaim`]: crate::transport::SendConn::reclaim
fn guards(s: &Schedule, l: &Layout, safe: &[Vec<bool>]) -> Vec<Vec<bool>> {
    let mut held = regions(s, l, Step::sends_as_is);
    held.retain(|&(c, i, _)| !safe[c][i]);
    per_step(s, |wc, wi, st| {
        st.writes()
            .map(|w| l.resolve(w))
            .is_some_and(|w| held.iter().any(|&(c, i, r)| may_meet((c, i), (wc, wi)) && w.overlaps(&r)))
    })
}

impl Wiring {
    /// Finds (and makes) the connections of `sched`'s steps, its channels
    /// mapped from `channel_base` on, and works out what it may lend.
    pub(super) fn new(sched: &Arc<Schedule>, layout: &Layout, channel_base: u32, conns: &mut Conns) -> Result<Self> {
        let mut links = Vec::with_capacity(sched.channels.len());
        for (c, ch) in sched.channels.iter().enumerate() {
            let channel = channel_base + c as u32;
            let mut l = Vec::with_capacity(ch.len());
            for st in ch {
                let s = st.send_peer().map(|p| conns.send(p, channel)).transpose()?;
                let r = st.recv_peer().map(|p| conns.recv(p, channel)).transpose()?;
                l.push((s, r));
            }
            links.push(l);
        }
        let mut uses: Vec<usize> = links
            .iter()
            .flatten()
            .flat_map(|&(s, r)| [s.map(|i| conns.send_id(i)), r.map(|i| conns.recv_id(i))])
            .flatten()
            .collect();
        uses.sort_unstable();
        uses.dedup();
        let (lendable, guards, lands) = if sched.channels.iter().map(Vec::len).sum::<usize>() > MAX_ANALYSED {
            // what the analysis could only allow: nothing lent without a
            // slot held for it, every write first taking lent memory back,
            // nothing received straight into the call's buffers
            let all = |v: bool| sched.channels.iter().map(|ch| vec![v; ch.len()]).collect::<Vec<_>>();
            (all(false), all(true), all(false))
        } else {
            let lendable = lendable(sched, layout);
            let guards = guards(sched, layout, &lendable);
            (lendable, guards, lands(sched, layout))
        };
        Ok(Wiring { sched: Arc::clone(sched), links, uses, lendable, guards, lands })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{generate, Algo, Coll, Params};
    use crate::topo::Hosts;

    fn sched(coll: Coll, algo: Algo, n: usize, rank: usize, count: usize, in_place: bool, hosts: &Hosts) -> Schedule {
        let p = Params { nranks: n, rank, count, root: n / 2, channels: 2, chunk: 5, in_place, hosts };
        generate(coll, algo, &p).expect("schedule")
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
        let p = Params {
            nranks: 4,
            rank: 1,
            count: 1 << 14,
            root: 0,
            channels: 1,
            chunk: 1,
            in_place: true,
            hosts: &hosts,
        };
        let s = Arc::new(generate(Coll::AllReduce, Algo::Ring, &p).expect("schedule"));
        assert!(s.channels[0].len() > MAX_ANALYSED);
        let l = Coll::AllReduce.layout(4, 1, 1 << 14, 0, true);
        let reg = Arc::new(
            crate::transport::Registry::new(vec![Arc::new(crate::transport::local::Fabric::new(4, 4, 64).endpoint(1))
                as Arc<dyn crate::transport::Transport>])
            .expect("registry"),
        );
        let mut conns =
            Conns::new(reg, 1, 1, Arc::from([0, 1, 2, 3]), crate::transport::Geometry { nslots: 4, slot_bytes: 64 });
        let w = Wiring::new(&s, &l, 0, &mut conns).expect("wiring");
        assert!(w.lendable[0].iter().all(|&b| !b) && w.lands[0].iter().all(|&b| !b));
        assert!(w.guards[0].iter().all(|&b| b));
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
