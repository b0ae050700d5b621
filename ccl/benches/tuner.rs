//! What one tuner decision costs: every all-reduce algorithm priced for
//! one size class on the shipped 8-ranks-per-host H100 model, by the
//! simulator at 64 ranks and by the closed form above (`tune::SIM_RANKS`).
//!
//! `cargo bench -p ccl --bench tuner`
#![allow(missing_docs)]

use ccl::algo::Coll;
use ccl::sim::{Call, Model};
use ccl::topo::Hosts;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("tuner decision, all_reduce");
    let model = Model::H100;
    for ranks in [64usize, 4096, 16384] {
        let hosts = Hosts::blocks(&vec![8; ranks / 8]);
        for bytes in [8usize, 1 << 30] {
            let count = (bytes / 4).max(1);
            let call = Call {
                coll: Coll::AllReduce,
                count,
                elem: 4,
                root: 0,
                channels: 1,
                chunk: 1 << 17,
                slot: 8192,
                in_place: false,
            };
            g.bench_with_input(BenchmarkId::new(format!("{bytes} B"), ranks), &ranks, |b, _| {
                b.iter(|| ccl::tune::ranked(black_box(&call), &hosts, &model))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
