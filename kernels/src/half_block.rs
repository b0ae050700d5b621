//! `f16` and `bf16` reductions through `f32`.
//!
//! Half-precision elements are widened into two stack blocks of `f32`,
//! reduced with the `f32` kernel, and rounded back once. The block is small
//! enough to stay in L1 and large enough that the conversions (F16C on x86
//! where the CPU has it, shifts for bf16) run as vector loops.

use crate::{Arith, ArithOp};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements per stack block: 2 blocks × 256 × 4 B = 2 KiB of stack.
const BLOCK: usize = 256;

macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline]
            fn apply(op: ArithOp, a: Self, b: Self) -> Self {
                <$t>::from_f32(f32::apply(op, a.to_f32(), b.to_f32()))
            }
            fn reduce_into(op: ArithOp, dst: &mut [Self], src: &[Self]) {
                let mut fa = [0f32; BLOCK];
                let mut fb = [0f32; BLOCK];
                for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
                    let n = d.len().min(s.len());
                    d[..n].convert_to_f32_slice(&mut fa[..n]);
                    s[..n].convert_to_f32_slice(&mut fb[..n]);
                    f32::reduce_into(op, &mut fa[..n], &fb[..n]);
                    d[..n].convert_from_f32_slice(&fa[..n]);
                }
            }
            fn reduce3(op: ArithOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                let mut fa = [0f32; BLOCK];
                let mut fb = [0f32; BLOCK];
                let blocks = dst.chunks_mut(BLOCK).zip(a.chunks(BLOCK)).zip(b.chunks(BLOCK));
                for ((d, x), y) in blocks {
                    let n = d.len().min(x.len()).min(y.len());
                    x[..n].convert_to_f32_slice(&mut fa[..n]);
                    y[..n].convert_to_f32_slice(&mut fb[..n]);
                    f32::reduce_into(op, &mut fa[..n], &fb[..n]);
                    d[..n].convert_from_f32_slice(&fa[..n]);
                }
            }
            fn div_assign(buf: &mut [Self], n: usize) {
                let n = n.max(1) as f32;
                for x in buf {
                    *x = <$t>::from_f32(x.to_f32() / n);
                }
            }
        }
    )*};
}

half_arith!(f16, bf16);
