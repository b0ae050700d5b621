//! Every collective × every algorithm (forced through the configuration) ×
//! element types and operators × rank counts {1,2,3,4,5,7,8,16}, as
//! threads, on fresh random data, against a sequential reference.
//! Float sums are compared exactly on integer-valued data and with a
//! tolerance on arbitrary data.

mod common;

use ccl::algo::Algo;
use ccl::testing::LocalJob;
use ccl::Config;
use common::matrix::everything;
use common::seed;
use std::time::Duration;

const RANKS: [usize; 8] = [1, 2, 3, 4, 5, 7, 8, 16];

/// Small slots (512 B) so that 700 elements take several slots and pieces.
fn config(algo: Option<Algo>, channels: usize) -> Config {
    Config { algo, nchannels: channels, buffsize: 4096, timeout: Duration::from_secs(120), ..Config::default() }
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
    let seed = seed();
    for n in RANKS {
        let job = LocalJob::new(n).config(config(algo, channels)).hosts(&host_sizes(n));
        for (rank, r) in job.run(|g| everything(&g, seed)).into_iter().enumerate() {
            if let Err(e) = r {
                panic!("algo {algo:?}, {n} ranks, rank {rank}: {e} (seed {seed})");
            }
        }
    }
}

#[test]
fn ring() {
    matrix(Some(Algo::Ring), 1);
}

#[test]
fn tree() {
    matrix(Some(Algo::Tree), 1);
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
