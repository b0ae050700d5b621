//! Reduce kernels against memcpy of the same bytes.
//!
//! `cargo bench -p ccl-kernels` prints, per size, the throughput of
//! `dst += src` for f32, bf16 and f16 and of a plain copy, all counted as the
//! bytes of `dst`, so the three numbers compare directly.
#![allow(missing_docs)]

use ccl_kernels::{Arith, ArithOp};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernels");
    for bytes in [32usize << 10, 1 << 20, 16 << 20] {
        g.throughput(Throughput::Bytes(bytes as u64));
        let nf = bytes / 4;
        let (mut d, s) = (vec![1.0f32; nf], vec![2.0f32; nf]);
        g.bench_with_input(BenchmarkId::new("f32_sum", bytes), &bytes, |b, _| {
            b.iter(|| f32::reduce_into(ArithOp::Sum, black_box(&mut d), black_box(&s)))
        });
        let nh = bytes / 2;
        let (mut dh, sh) = (vec![bf16::ONE; nh], vec![bf16::ONE; nh]);
        g.bench_with_input(BenchmarkId::new("bf16_sum", bytes), &bytes, |b, _| {
            b.iter(|| bf16::reduce_into(ArithOp::Sum, black_box(&mut dh), black_box(&sh)))
        });
        let (mut df, sf) = (vec![half::f16::ONE; nh], vec![half::f16::ONE; nh]);
        g.bench_with_input(BenchmarkId::new("f16_sum", bytes), &bytes, |b, _| {
            b.iter(|| half::f16::reduce_into(ArithOp::Sum, black_box(&mut df), black_box(&sf)))
        });
        let (mut db, sb) = (vec![0u8; bytes], vec![1u8; bytes]);
        g.bench_with_input(BenchmarkId::new("memcpy", bytes), &bytes, |b, _| {
            b.iter(|| ccl_kernels::copy(black_box(&mut db), black_box(&sb)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
