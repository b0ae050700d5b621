//! Which sends may go straight from the call's buffers: a pass over a
//! rank's schedule and layout, made once per plan. A connection that
//! copies anyway (a socket, whose kernel copies what it sends) then sends
//! those steps' memory where it lies instead of through a slot, and the
//! call stays unfinished, its buffers the caller's, until the connection
//! has sent it. The verifier proves the pass: no step writes memory a
//! lending send marked here may still be sending.

use super::{Layout, Region, Schedule};

/// Steps of a schedule beyond which it is not analysed (each step is
/// compared with every other): nothing lends, set-up stays linear.
pub const MAX_ANALYSED: usize = 4096;

/// Per channel, per step of `s` on `l`: whether the step sends memory of
/// the call as it is (a send, or the result a step has just written) that
/// no step writes afterwards: no other channel's at any time, none later
/// in its own. Such memory can go to a socket straight from there, and
/// stays as it was until the call ends.
pub fn lendable(s: &Schedule, l: &Layout) -> Vec<Vec<bool>> {
    if s.channels.iter().map(Vec::len).sum::<usize>() > MAX_ANALYSED {
        return s.channels.iter().map(|ch| vec![false; ch.len()]).collect();
    }
    let writes: Vec<(usize, usize, Region)> = s
        .channels
        .iter()
        .enumerate()
        .flat_map(|(c, ch)| ch.iter().enumerate().filter_map(move |(i, st)| Some((c, i, l.resolve(st.writes()?)))))
        .collect();
    s.channels
        .iter()
        .enumerate()
        .map(|(c, ch)| {
            ch.iter()
                .enumerate()
                .map(|(i, st)| {
                    st.sends_as_is().map(|r| l.resolve(r)).is_some_and(|r| {
                        // another channel's write at any time, or a later one of its own
                        !writes.iter().any(|&(wc, wi, w)| (wc != c || wi > i) && w.overlaps(&r))
                    })
                })
                .collect()
        })
        .collect()
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

    #[test]
    fn steps_send_from_the_buffers_only_what_nothing_writes_afterwards() {
        for coll in Coll::ALL {
            for algo in coll.algos().iter().copied() {
                for n in 1..=9 {
                    for hosts in [Hosts::flat(n), Hosts::blocks(&vec![1; n])] {
                        for in_place in [false, true] {
                            for rank in 0..n {
                                let s = sched(coll, algo, n, rank, 23, in_place, &hosts);
                                let l = coll.layout(n, rank, 23, n / 2, in_place);
                                assert_eq!(lendable(&s, &l), reference(&s, &l), "{coll} {algo} n={n} rank {rank}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_ring_all_reduce_sends_from_its_buffers_all_it_can() {
        let hosts = Hosts::flat(2);
        let sends = |algo: Algo, in_place: bool| {
            let s = sched(Coll::AllReduce, algo, 2, 0, 40, in_place, &hosts);
            let l = Coll::AllReduce.layout(2, 0, 40, 0, in_place);
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
        let out = sends(Algo::Ring, false);
        assert!(!out.is_empty() && out.iter().all(|&f| f), "{out:?}");
        // in place: a piece sent while reducing is received into later
        // (the all-gather half), a piece sent while gathering is final
        let inp = sends(Algo::Ring, true);
        assert!(inp.iter().any(|&f| f) && inp.iter().any(|&f| !f), "{inp:?}");
        // recursive doubling in place reduces into what it has just sent
        assert!(sends(Algo::RecursiveDoubling, true).iter().all(|&f| !f));
    }

    #[test]
    fn schedules_too_long_to_analyse_lend_nothing() {
        let hosts = Hosts::flat(4);
        let p = Params { nranks: 4, rank: 1, count: 1 << 14, root: 0, channels: 1, chunk: 1, in_place: false, hosts: &hosts };
        let s = generate(Coll::AllReduce, Algo::Ring, &p).expect("schedule");
        assert!(s.channels[0].len() > MAX_ANALYSED);
        let l = Coll::AllReduce.layout(4, 1, 1 << 14, 0, false);
        assert!(lendable(&s, &l).iter().flatten().all(|&f| !f));
    }
}
