//! Every generator × collective × rank count 1..=64, proved by the
//! symbolic verifier, plus proptest over counts, roots, channels, pieces,
//! slot sizes and host layouts.
//!
//! The pipelining rule the tuner follows is part of what is proved: a
//! piece of `chunk` elements never exceeds half a connection's slots.

use ccl::algo::verify::{verify, Case};
use ccl::algo::{Algo, Blocks, Coll};
use ccl::topo::Hosts;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::ops::Range;

/// Hosts of `per` ranks (the last one may be smaller), or one host.
fn hosts(n: usize, per: usize) -> Hosts {
    let per = per.max(1);
    let mut sizes = vec![per; n / per];
    if !n.is_multiple_of(per) {
        sizes.push(n % per);
    }
    Hosts::blocks(&sizes)
}

fn case(coll: Coll, algo: Algo, n: usize, count: usize) -> Case {
    let (slot_elems, nslots) = (3, 4);
    Case {
        coll,
        algo,
        nranks: n,
        count,
        root: (n * 2) / 3,
        channels: 1,
        chunk: slot_elems * nslots / 2,
        in_place: false,
        around: false,
        hosts: Hosts::flat(n),
        slot_elems,
        nslots,
        blocks: None,
    }
}

fn check(c: &Case) {
    if let Err(e) = verify(c) {
        panic!(
            "{} {} n={} count={} root={} ch={} chunk={} in_place={} hosts={:?} slots={}x{}: {e}",
            c.coll,
            c.algo,
            c.nranks,
            c.count,
            c.root,
            c.channels,
            c.chunk,
            c.in_place,
            c.hosts.groups().iter().map(Vec::len).collect::<Vec<_>>(),
            c.nslots,
            c.slot_elems
        );
    }
}

/// Every algorithm of every collective, every rank count 1..=64, counts
/// 0, 1, a prime, fewer than the ranks and more, in place and not.
#[test]
fn every_generator_for_1_to_64_ranks() {
    for n in 1..=64usize {
        for coll in Coll::ALL {
            for &algo in coll.algos() {
                for count in [0, 1, 7, n.saturating_sub(1), 2 * n + 3] {
                    for in_place in [false, true] {
                        let mut c = case(coll, algo, n, count);
                        c.in_place = in_place;
                        if matches!(algo, Algo::RingRing | Algo::TreeRing) {
                            c.hosts = hosts(n, 1 + n % 5);
                        }
                        check(&c);
                    }
                }
            }
        }
    }
}

/// The schedules on shared buffers (each rank reading and writing its
/// peers' buffers), every rank count 1..=64, in place and not, in blocks
/// of 2 elements, outputs written around the cache or not: results, and no
/// access of a peer's memory unordered with its owner's or another rank's.
#[test]
fn shared_buffer_schedules_for_1_to_64_ranks() {
    for n in 1..=64usize {
        for coll in Coll::ALL {
            for in_place in [false, true] {
                if !coll.on_shared(in_place) {
                    continue;
                }
                for count in [0, 1, 7, n.saturating_sub(1), 2 * n + 3] {
                    for around in [false, true] {
                        let mut c = case(coll, Algo::Direct, n, count);
                        (c.in_place, c.chunk, c.around) = (in_place, 2, around);
                        check(&c);
                    }
                }
            }
        }
    }
}

/// Rings and trees of their own per channel (each host's ranks rotated by
/// the channel, `Hosts::channel_ring`) across hosts of every shape: 1..=64
/// ranks on 3 and 4 channels, hosts of 2 to 5 ranks (the last one smaller)
/// or hosts whose ranks are not adjacent.
#[test]
fn channel_rings_and_trees_across_hosts_for_1_to_64_ranks() {
    for n in 1..=64usize {
        for (coll, algo) in [
            (Coll::AllReduce, Algo::Ring),
            (Coll::ReduceScatter, Algo::Ring),
            (Coll::AllGather, Algo::Ring),
            (Coll::AllReduce, Algo::Tree),
        ] {
            for count in [7, 2 * n + 3] {
                let mut c = case(coll, algo, n, count);
                (c.channels, c.in_place) = (3 + n % 2, n % 3 == 0);
                // hosts of 2 to 5 ranks in blocks, or (odd counts) not adjacent
                c.hosts = if n % 2 == 0 {
                    hosts(n, 2 + n % 4)
                } else {
                    Hosts::from_ids(&(0..n).map(|r| r % (1 + n % 5)).collect::<Vec<_>>())
                };
                check(&c);
            }
        }
    }
}

/// Hierarchical forms on uneven host layouts, and flat generators on
/// topology-ordered rings (hosts interleaved).
#[test]
fn host_layouts() {
    for layout in [
        vec![1],
        vec![3, 1],
        vec![1, 3],
        vec![2, 2, 2],
        vec![4, 3, 5],
        vec![1, 1, 1, 1, 1],
        vec![8, 8],
        vec![5, 2, 7, 1],
    ] {
        let n: usize = layout.iter().sum();
        for coll in Coll::ALL {
            for &algo in coll.algos() {
                for count in [0, 1, 11, 3 * n + 1] {
                    let mut c = case(coll, algo, n, count);
                    c.hosts = Hosts::blocks(&layout);
                    check(&c);
                    // the same sizes, with ranks of a host not adjacent
                    let ids: Vec<usize> = (0..n).map(|r| r % layout.len()).collect();
                    c.hosts = Hosts::from_ids(&ids);
                    check(&c);
                }
            }
        }
    }
}

fn any_case() -> impl Strategy<Value = Case> {
    let colls: Vec<(Coll, Algo)> = Coll::ALL.iter().flat_map(|&c| c.algos().iter().map(move |&a| (c, a))).collect();
    (
        proptest::sample::select(colls),
        1usize..=64,
        prop_oneof![Just(0usize), Just(1), 2usize..40, 40usize..300],
        0usize..64,
        1usize..=4,
        1usize..=4,
        1usize..=8,
        any::<bool>(),
        1usize..=6,
    )
        .prop_map(|((coll, algo), n, count, root, channels, slot_elems, half_slots, in_place, per_host)| Case {
            coll,
            algo,
            nranks: n,
            count,
            root: root % n,
            channels,
            chunk: slot_elems * half_slots,
            in_place,
            around: false,
            hosts: hosts(n, per_host),
            slot_elems,
            nslots: 2 * half_slots,
            blocks: None,
        })
}

/// Blocks of random counts (a third of them 0) for `n` ranks: packed in
/// rank order, or (`spread`) in a random order with gaps between them.
fn random_blocks(rng: &mut impl Rng, n: usize, most: usize, spread: bool) -> Box<[Range<usize>]> {
    let counts: Vec<usize> = (0..n).map(|_| if rng.gen_ratio(1, 3) { 0 } else { rng.gen_range(1..=most) }).collect();
    if !spread {
        return Blocks::packed(&counts);
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(rng);
    let mut displs = vec![0; n];
    let mut at = 0;
    for r in order {
        at += rng.gen_range(0..3);
        displs[r] = at;
        at += counts[r];
    }
    Blocks::at(&counts, &displs)
}

/// Every rank's blocks of a varying call of `coll`: the same on every
/// rank, or for all-to-all, what each rank sends each other one and
/// receives, matching.
fn random_call(rng: &mut impl Rng, coll: Coll, n: usize, most: usize) -> Vec<Blocks> {
    if coll != Coll::AllToAll {
        let spread = rng.gen();
        let all = random_blocks(rng, n, most, spread);
        return vec![Blocks::new(all, Box::new([])); n];
    }
    // counts[s][d]: what s sends d, placed at random on both sides
    let counts: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| rng.gen_range(0..=most)).collect()).collect();
    let place = |rng: &mut _, lens: Vec<usize>| -> Box<[Range<usize>]> {
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(rng);
        let mut displs = vec![0; n];
        let mut at = 0;
        for r in order {
            displs[r] = at;
            at += lens[r];
        }
        Blocks::at(&lens, &displs)
    };
    (0..n)
        .map(|r| {
            let all = place(rng, counts[r].clone());
            let recv = place(rng, (0..n).map(|s| counts[s][r]).collect());
            Blocks::new(all, recv)
        })
        .collect()
}

/// Calls whose counts vary by rank (MPI's v-collectives), every form of
/// each, 1..=64 ranks, counts drawn afresh (zeros among them), placed in
/// rank order or not, with gaps or not, on 1 to 3 channels, in place
/// where the call has that form.
#[test]
fn variable_blocks_for_1_to_64_ranks() {
    let seed = rand::random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for n in 1..=64usize {
        for coll in Coll::ALL {
            for &algo in coll.algos_v() {
                for most in [1, 5, 2 * n + 3] {
                    let mut c = case(coll, algo, n, 0);
                    c.blocks = Some(random_call(&mut rng, coll, n, most));
                    c.channels = 1 + n % 3;
                    c.in_place = coll != Coll::AllToAll && rng.gen();
                    c.root = rng.gen_range(0..n);
                    if n % 4 == 1 {
                        c.hosts = hosts(n, 1 + n % 5);
                    }
                    if let Err(e) = verify(&c) {
                        panic!("seed {seed}: {coll} {algo} n={n} {c:?}: {e}");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_cases_verify(c in any_case()) {
        let r = verify(&c);
        prop_assert!(r.is_ok(), "{c:?}: {}", r.err().unwrap_or_default());
    }
}

/// The verifier is not a rubber stamp: broken schedules are rejected.
#[test]
fn verifier_rejects_broken_schedules() {
    // pieces bigger than the connection can hold deadlock a ring
    let mut c = case(Coll::AllReduce, Algo::Ring, 4, 64);
    c.chunk = 16;
    c.nslots = 1;
    c.slot_elems = 1;
    let e = verify(&c).expect_err("must deadlock");
    assert!(e.contains("deadlock"), "{e}");
    // an algorithm that does not implement the call
    assert!(verify(&case(Coll::Broadcast, Algo::RecursiveDoubling, 4, 8)).is_err());
}
