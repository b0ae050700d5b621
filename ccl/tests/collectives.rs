//! Every collective × every algorithm (forced through the configuration) ×
//! element types and operators × rank counts {1,2,3,4,5,7,8,16}, as
//! threads, on fresh random data, against a sequential reference.
//! Float sums are compared exactly on integer-valued data and with a
//! tolerance on arbitrary data.

mod common;

use ccl::algo::Algo;
use ccl::config::SlotStores;
use ccl::testing::LocalJob;
use ccl::Config;
use common::matrix::everything;
use common::seed;
use std::time::Duration;

const RANKS: [usize; 8] = [1, 2, 3, 4, 5, 7, 8, 16];

/// Small slots (512 B) so that 700 elements take several slots and pieces.
fn config(algo: Option<Algo>, channels: usize) -> Config {
    Config {
        algo,
        nchannels: Some(channels),
        buffsize: Some(16384),
        timeout: Duration::from_secs(120),
        ..Config::default()
    }
}

/// Hosts of up to 3 ranks, for the hierarchical forms.
fn host_sizes(n: usize) -> Vec<usize> {
    let mut v = vec![3; n / 3];
    if !n.is_multiple_of(3) {
        v.push(n % 3);
    }
    v
}

fn matrix(algo: Option<Algo>, channels: usize) {
    run_matrix(&RANKS, config(algo, channels));
}

fn run_matrix(ranks: &[usize], config: Config) {
    let seed = seed();
    for &n in ranks {
        let job = LocalJob::new(n).config(config.clone()).hosts(&host_sizes(n));
        for (rank, r) in job.run(|g| everything(&g, seed)).into_iter().enumerate() {
            if let Err(e) = r {
                panic!("algo {:?}, {n} ranks, rank {rank}: {e} (seed {seed})", config.algo);
            }
        }
    }
}

#[test]
fn ring() {
    matrix(Some(Algo::Ring), 1);
}

#[test]
fn ring_on_three_channels_each_entering_hosts_elsewhere() {
    // across hosts of 3, channel c enters each host at its c-th rank
    matrix(Some(Algo::Ring), 3);
}

#[test]
fn tree() {
    matrix(Some(Algo::Tree), 1);
}

#[test]
fn direct_on_two_channels() {
    // gather and scatter straight to and from the root (and all-to-all)
    matrix(Some(Algo::Direct), 2);
}

#[test]
fn recursive_doubling() {
    matrix(Some(Algo::RecursiveDoubling), 1);
}

#[test]
fn halving_doubling() {
    matrix(Some(Algo::HalvingDoubling), 1);
}

#[test]
fn ring_ring() {
    matrix(Some(Algo::RingRing), 1);
}

#[test]
fn tree_ring() {
    matrix(Some(Algo::TreeRing), 1);
}

#[test]
fn tuner_choice_with_three_channels() {
    matrix(None, 3);
}

#[test]
fn every_algorithm_writing_outputs_around_the_cache() {
    // the path of large outputs (non-temporal stores), here taken by every output
    for algo in [Algo::Ring, Algo::Tree, Algo::RecursiveDoubling, Algo::HalvingDoubling, Algo::TreeRing] {
        run_matrix(&[1, 2, 3, 4], Config { nt_stores_min: Some(1), ..config(Some(algo), 1) });
    }
}

#[test]
fn every_algorithm_writing_slots_around_the_cache() {
    // CCL_SLOT_STORES=around: every slot a step sends is written with non-temporal stores
    for algo in [Algo::Ring, Algo::Tree, Algo::RecursiveDoubling, Algo::HalvingDoubling, Algo::TreeRing] {
        run_matrix(&[2, 3, 4], Config { slot_stores: SlotStores::Around, ..config(Some(algo), 1) });
    }
    // and both: the ring's fused steps store each reduced piece twice
    // around the cache, into the output and into the slot
    let both = Config { slot_stores: SlotStores::Around, nt_stores_min: Some(1), ..config(Some(Algo::Ring), 1) };
    run_matrix(&[2, 3, 4], both);
}

#[test]
fn automatic_slot_stores_keep_results_exact_while_probing() {
    // CCL_SLOT_STORES=auto on 2 ranks (each with a core where the machine
    // has 2): 1 MiB calls are timed, and some of them (a class's 4th and
    // 5th, then others) are written around the cache while the rest go
    // through it; every result must be exact either way
    use ccl::Sum;
    use common::{compare, input, reference};
    let (seed, n, len) = (seed(), 2, 1 << 18);
    let job = LocalJob::new(n).config(Config { slot_stores: SlotStores::Auto, ..Config::default() });
    for (rank, r) in job
        .run(|g| {
            let c = g.typed::<f32>();
            for call in 0..24u64 {
                let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(seed, call, r, len, true)).collect();
                let mut v = inputs[g.rank()].clone();
                c.all_reduce(&mut v, Sum).map_err(|e| e.to_string())?;
                compare(&format!("call {call}"), &v, &reference::<f32, Sum>(&inputs), n)?;
            }
            Ok::<(), String>(())
        })
        .into_iter()
        .enumerate()
    {
        if let Err(e) = r {
            panic!("rank {rank}: {e} (seed {seed})");
        }
    }
}

#[test]
fn repeated_calls_on_new_buffers_are_exact() {
    // A blocking call with the shape and types of the one before reuses its
    // executor (connections, scratch, channel state), pointed at the new
    // buffers. Every call here gets buffers of its own, in place and not,
    // with calls of another shape and type in between, and must be exact.
    use ccl::{Max, Sum};
    use common::{compare, input, reference};
    let seed = seed();
    for algo in [Algo::Ring, Algo::Tree, Algo::RecursiveDoubling, Algo::HalvingDoubling, Algo::TreeRing] {
        for n in [2, 3, 4] {
            let job = LocalJob::new(n).config(config(Some(algo), 1)).hosts(&host_sizes(n));
            let results = job.run(|g| {
                let (c, c64) = (g.typed::<f32>(), g.typed::<f64>());
                let me = g.rank();
                for call in 0..12u64 {
                    let len = 700;
                    let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(seed, call, r, len, true)).collect();
                    let want = reference::<f32, Sum>(&inputs);
                    let mut out = vec![f32::NAN; len];
                    c.all_reduce_into(&inputs[me], &mut out, Sum).map_err(|e| e.to_string())?;
                    compare(&format!("{algo:?} call {call} out of place"), &out, &want, n)?;
                    // the same shape again, then once more in place
                    let mut again = vec![f32::NAN; len];
                    c.all_reduce_into(&inputs[me], &mut again, Sum).map_err(|e| e.to_string())?;
                    compare(&format!("{algo:?} call {call} repeated"), &again, &want, n)?;
                    let mut v = inputs[me].clone();
                    c.all_reduce(&mut v, Sum).map_err(|e| e.to_string())?;
                    compare(&format!("{algo:?} call {call} in place"), &v, &want, n)?;
                    if call % 3 == 2 {
                        // another type, operator and size in between
                        let other: Vec<Vec<f64>> = (0..n).map(|r| input(seed, 100 + call, r, 33, false)).collect();
                        let mut w = other[me].clone();
                        c64.all_reduce(&mut w, Max).map_err(|e| e.to_string())?;
                        compare(&format!("{algo:?} call {call} f64 max"), &w, &reference::<f64, Max>(&other), n)?;
                    }
                }
                Ok::<(), String>(())
            });
            for (rank, r) in results.into_iter().enumerate() {
                if let Err(e) = r {
                    panic!("{n} ranks, rank {rank}: {e} (seed {seed})");
                }
            }
        }
    }
}
