//! What one tuner decision costs: every all-reduce algorithm priced by the
//! closed form for one size class on the shipped 8-ranks-per-host H100
//! model, from 2 ranks to 16384 (12288 is not a power of two: doubling's
//! fold is looked up level by level); and what the simulator, which the
//! tuner no longer runs, takes for the same at 64 and 4096 ranks (as
//! `ccl-sim` runs it).
//!
//! `cargo bench -p ccl --bench tuner`
#![allow(missing_docs)]

use ccl::algo::Coll;
use ccl::sim::{Call, Model};
use ccl::topo::Hosts;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

/// An all-reduce of `bytes` of f32, as the tuner cuts it.
fn call(bytes: usize) -> Call {
    Call {
        coll: Coll::AllReduce,
        count: (bytes / 4).max(1),
        elem: 4,
        root: 0,
        channels: 1,
        chunk: 1 << 17,
        slot: 8192,
        in_place: false,
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("tuner decision, all_reduce");
    let model = Model::H100;
    for ranks in [2usize, 64, 4096, 12288, 16384] {
        let hosts = Hosts::blocks(&vec![ranks.min(8); ranks.div_ceil(8)]);
        for bytes in [8usize, 1 << 30] {
            let call = call(bytes);
            g.bench_with_input(BenchmarkId::new(format!("{bytes} B"), ranks), &ranks, |b, _| {
                b.iter(|| ccl::tune::ranked(black_box(&call), &hosts, &model))
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("simulator, all_reduce");
    g.sample_size(10);
    for ranks in [64usize, 4096] {
        let hosts = Hosts::blocks(&vec![8; ranks / 8]);
        for bytes in [8usize, 1 << 30] {
            let call = call(bytes);
            g.bench_with_input(BenchmarkId::new(format!("{bytes} B"), ranks), &bytes, |b, _| {
                b.iter(|| ccl::tune::simulated(black_box(&call), Coll::AllReduce.algos(), &hosts, &model))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
