//! Ranks the simulator need not time one by one: where a symmetry of the
//! hosts moves every rank's schedule onto another's, ranks it maps onto
//! each other do the same at the same moments, and one of each class
//! stands for all.
//!
//! Hosts of `s` ranks each, ranks numbered host by host, have two such
//! symmetries that keep a rank's place on its host (and so its network
//! link and its core): moving every rank `h` hosts on (`r + h·s`, modulo
//! the ranks), and, with powers of two of hosts and of ranks per host,
//! flipping the host bits (`r XOR h·s`). A ring over the ranks in host
//! order, a ring inside each host and one across hosts, a tree inside
//! each host and a ring across, and the dissemination barrier are the
//! same under the first; recursive doubling
//! and halving, which pair `r` with `r XOR 2^k`, under the second. Both
//! map every rank onto one of the first host's ranks, `r % s`: those are
//! the ones timed, and a message to rank `q` goes to rank `q % s` in its
//! place, as rank `q` is doing the same then. Trees across hosts and
//! chains from a root have no such symmetry.
//!
//! A count that does not split evenly over the ranks breaks the symmetry
//! a little: pieces differ by an element, and some are empty. The ranks
//! timed then keep their empty steps, so that every rank still has as
//! many steps as its images: the time is that of the slowest rank's
//! path as if every piece were as long as the longest (one latency more
//! than the whole simulation, at most, where only some pieces are empty).
//! Recursive halving cuts the blocks it exchanges by length, so there an
//! uneven count changes the steps: those calls are timed rank by rank.
//!
//! All-to-all is the same under the first symmetry too, but not its
//! timing: every host's link takes messages from many hosts at the same
//! moment, and the simulator serves them in rank order, which moving the
//! ranks changes. It has one algorithm, which the tuner need not time.

use crate::algo::{Algo, Coll};
use crate::topo::Hosts;

/// The symmetry under which a schedule is the same on every host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Symmetry {
    /// `r ↦ (r + h·s) mod n`.
    Shift,
    /// `r ↦ r XOR h·s`.
    Flip,
}

/// The symmetry `algo` running `coll` has, on hosts of equal size.
pub(crate) fn symmetry(coll: Coll, algo: Algo) -> Option<Symmetry> {
    use Algo::*;
    match (coll, algo) {
        (Coll::AllReduce | Coll::AllGather | Coll::ReduceScatter, Ring) => Some(Symmetry::Shift),
        (Coll::AllReduce, RingRing | TreeRing) => Some(Symmetry::Shift),
        (Coll::Barrier, Dissemination) => Some(Symmetry::Shift),
        (Coll::AllReduce | Coll::AllGather, RecursiveDoubling) => Some(Symmetry::Flip),
        (Coll::AllReduce | Coll::ReduceScatter, HalvingDoubling) => Some(Symmetry::Flip),
        _ => None,
    }
}

/// Ranks per host where every host has as many, numbered host by host.
fn equal_blocks(hosts: &Hosts) -> Option<usize> {
    let s = hosts.sizes().first().copied()?;
    let n = hosts.nranks();
    (s > 0 && n.is_multiple_of(s) && (0..n).all(|r| hosts.host_of(r) == r / s)).then_some(s)
}

/// How many ranks the simulator times for `algo` running `coll` of
/// `count` elements over `channels` on `hosts`: the first `m`, rank `r`
/// standing for every rank `q` with `q % m == r`. `m` is the rank count
/// where no symmetry applies.
pub(crate) fn classes(coll: Coll, algo: Algo, count: usize, channels: usize, hosts: &Hosts) -> usize {
    let n = hosts.nranks();
    let Some(s) = equal_blocks(hosts) else { return n };
    let even = algo != Algo::HalvingDoubling || count.is_multiple_of(channels.max(1).saturating_mul(n));
    match symmetry(coll, algo) {
        Some(Symmetry::Shift) => s,
        Some(Symmetry::Flip) if s.is_power_of_two() && n.is_power_of_two() && even => s,
        _ => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{generate_keeping_empty, Params, Step};

    /// A step as the simulator sees it: kind, peers, length.
    fn shape(s: &Step, map: impl Fn(usize) -> usize) -> (std::mem::Discriminant<Step>, Option<usize>, Option<usize>, usize) {
        (std::mem::discriminant(s), s.recv_peer().map(&map), s.send_peer().map(&map), s.len())
    }

    #[test]
    fn every_folded_schedule_is_another_rank_s_moved_by_the_symmetry() {
        // every host shape up to 64 ranks, counts that split evenly and
        // counts that do not (whose empty steps the simulator keeps, so
        // that the steps still match; lengths then differ by a piece's
        // remainder at most)
        let mut folded = 0;
        for hosts in 1..=16usize {
            for per in [1usize, 2, 3, 4, 8] {
                let n = hosts * per;
                if n > 64 {
                    continue;
                }
                let h = Hosts::blocks(&vec![per; hosts]);
                for coll in Coll::ALL {
                    for &algo in coll.algos() {
                        for (count, exact) in [(n * 2 * 4 * 3, true), (n * 2 * 4 * 3 + 5, false), (3, false)] {
                            let m = classes(coll, algo, count, 2, &h);
                            let Some(sym) = symmetry(coll, algo) else {
                                assert_eq!(m, n, "{coll} {algo}");
                                continue;
                            };
                            if m == n {
                                continue;
                            }
                            assert_eq!(m, per);
                            let sched = |rank: usize| {
                                let p = Params {
                                    nranks: n,
                                    rank,
                                    count,
                                    root: 0,
                                    channels: 2,
                                    chunk: 4,
                                    in_place: false,
                                    around: false,
                                    hosts: &h,
                                    blocks: None,
                                };
                                generate_keeping_empty(coll, algo, &p).expect("generates").channels
                            };
                            let reps: Vec<_> = (0..per).map(sched).collect();
                            for g in 1..hosts {
                                let moved = |r: usize| match sym {
                                    Symmetry::Shift => (r + g * per) % n,
                                    Symmetry::Flip => r ^ (g * per),
                                };
                                for (l, rep) in reps.iter().enumerate() {
                                    let other = sched(moved(l));
                                    assert_eq!(other.len(), rep.len());
                                    for (a, b) in rep.iter().zip(&other) {
                                        assert_eq!(a.len(), b.len(), "{coll} {algo} n={n}: steps per channel");
                                        for (x, y) in a.iter().zip(b) {
                                            let (mut x, mut y) = (shape(x, moved), shape(y, |q| q));
                                            if !exact {
                                                (x.3, y.3) = (0, 0);
                                            }
                                            assert_eq!(x, y, "{coll} {algo} {count} on {hosts} x {per}, rank {l}");
                                        }
                                    }
                                }
                            }
                            folded += 1;
                        }
                    }
                }
            }
        }
        assert!(folded > 100, "{folded} cases");
    }

    #[test]
    fn only_equal_hosts_numbered_in_order_fold() {
        let c = |coll, algo, count, hosts: &Hosts| classes(coll, algo, count, 2, hosts);
        assert_eq!(c(Coll::AllReduce, Algo::Ring, 7, &Hosts::blocks(&[4; 8])), 4);
        assert_eq!(c(Coll::AllReduce, Algo::Ring, 64, &Hosts::blocks(&[4, 4, 2])), 10);
        assert_eq!(c(Coll::AllReduce, Algo::Ring, 64, &Hosts::from_ids(&[0, 1, 0, 1])), 4);
        assert_eq!(c(Coll::AllReduce, Algo::Tree, 64, &Hosts::blocks(&[4; 8])), 32);
        assert_eq!(c(Coll::Broadcast, Algo::Ring, 64, &Hosts::blocks(&[4; 8])), 32);
        assert_eq!(c(Coll::AllReduce, Algo::Ring, 64, &Hosts::blocks(&[1; 5])), 1);
        // flips need powers of two, and counts that split evenly
        assert_eq!(c(Coll::AllReduce, Algo::RecursiveDoubling, 64, &Hosts::blocks(&[4; 8])), 4);
        assert_eq!(c(Coll::AllReduce, Algo::RecursiveDoubling, 63, &Hosts::blocks(&[4; 8])), 4);
        assert_eq!(c(Coll::AllReduce, Algo::HalvingDoubling, 64, &Hosts::blocks(&[4; 8])), 4);
        assert_eq!(c(Coll::AllReduce, Algo::HalvingDoubling, 63, &Hosts::blocks(&[4; 8])), 32);
        assert_eq!(c(Coll::AllReduce, Algo::RecursiveDoubling, 64 * 3, &Hosts::blocks(&[4; 6])), 24);
        assert_eq!(c(Coll::AllReduce, Algo::RecursiveDoubling, 64 * 3, &Hosts::blocks(&[3; 8])), 24);
    }
}
