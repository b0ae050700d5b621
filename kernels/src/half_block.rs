//! `f16` and `bf16` reductions through `f32`.
//!
//! Each element is widened to `f32`, reduced, and rounded back once (round
//! to nearest even, as `from_f32` does). The portable x86-64 baseline
//! (SSE2) cannot vectorise the conversions, so on CPUs with AVX2 and F16C
//! the same loops run compiled for those features, chosen at run time:
//! bf16 as one fused loop of shifts and a branch-free rounding, f16 through
//! the F16C conversion instructions in L1-sized blocks.

use crate::{Arith, ArithOp};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements per stack block of the blocked f16 path: 2 × 256 × 4 B = 2 KiB.
const BLOCK: usize = 256;

#[inline(always)]
fn bf16_widen(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

#[inline(always)]
fn bf16_narrow(x: f32) -> bf16 {
    let bits = x.to_bits();
    // round to nearest, ties to even; NaNs stay NaN (quietened)
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let nan = (bits >> 16) | 0x40;
    let is_nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if is_nan { nan } else { rounded } as u16)
}

/// Runs `$body` with `$f` bound to the f32 operator, chosen once.
macro_rules! with_op {
    ($op:expr, |$f:ident| $body:expr) => {
        match $op {
            ArithOp::Sum => {
                let $f = |a: f32, b: f32| a + b;
                $body
            }
            ArithOp::Prod => {
                let $f = |a: f32, b: f32| a * b;
                $body
            }
            ArithOp::Min => {
                let $f = |a: f32, b: f32| a.min(b);
                $body
            }
            ArithOp::Max => {
                let $f = |a: f32, b: f32| a.max(b);
                $body
            }
        }
    };
}

#[inline(always)]
fn bf16_into(op: ArithOp, dst: &mut [bf16], src: &[bf16]) {
    with_op!(op, |f| for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_narrow(f(bf16_widen(*d), bf16_widen(*s)));
    })
}

#[inline(always)]
fn bf16_3(op: ArithOp, dst: &mut [bf16], a: &[bf16], b: &[bf16]) {
    with_op!(op, |f| for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = bf16_narrow(f(bf16_widen(*x), bf16_widen(*y)));
    })
}

/// f16 in blocks: widen both operands, reduce in f32, round back.
#[inline(always)]
fn f16_blocks(
    op: ArithOp,
    dst: &mut [f16],
    a: Option<&[f16]>,
    b: &[f16],
    widen: impl Fn(&[f16], &mut [f32]),
    narrow: impl Fn(&[f32], &mut [f16]),
) {
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    let n = dst.len().min(b.len()).min(a.map_or(usize::MAX, <[f16]>::len));
    let mut i = 0;
    while i < n {
        let m = BLOCK.min(n - i);
        match a {
            Some(a) => widen(&a[i..i + m], &mut fa[..m]),
            None => widen(&dst[i..i + m], &mut fa[..m]),
        }
        widen(&b[i..i + m], &mut fb[..m]);
        with_op!(op, |f| for (x, y) in fa[..m].iter_mut().zip(&fb[..m]) {
            *x = f(*x, *y);
        });
        narrow(&fa[..m], &mut dst[i..i + m]);
        i += m;
    }
}

fn f16_portable(op: ArithOp, dst: &mut [f16], a: Option<&[f16]>, b: &[f16]) {
    f16_blocks(op, dst, a, b, |s, d| s.convert_to_f32_slice(d), |s, d| d.convert_from_f32_slice(s));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The same loops compiled for AVX2 and F16C.
    use super::*;
    use std::arch::x86_64::{
        __m128i, __m256, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps, _mm_loadu_si128,
        _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };

    /// Whether this CPU runs the AVX2 + F16C versions.
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
    }

    /// # Safety
    /// The CPU must support AVX2 ([`available`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn bf16_into(op: ArithOp, dst: &mut [bf16], src: &[bf16]) {
        super::bf16_into(op, dst, src)
    }

    /// # Safety
    /// The CPU must support AVX2 ([`available`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn bf16_3(op: ArithOp, dst: &mut [bf16], a: &[bf16], b: &[bf16]) {
        super::bf16_3(op, dst, a, b)
    }

    /// Widens with F16C, 8 at a time (a scalar tail).
    #[target_feature(enable = "avx2,f16c")]
    fn widen(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` keeps both 8-element accesses in bounds;
            // the loads and stores are unaligned forms; F16C is enabled.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                let f: __m256 = _mm256_cvtph_ps(h);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), f);
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// Rounds to nearest even with F16C, 8 at a time (a scalar tail).
    #[target_feature(enable = "avx2,f16c")]
    fn narrow(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: as in `widen`.
            unsafe {
                let f = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(f);
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = f16::from_f32(src[j]);
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C ([`available`]).
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn f16_blocks(op: ArithOp, dst: &mut [f16], a: Option<&[f16]>, b: &[f16]) {
        // the closures inherit this function's target features
        super::f16_blocks(op, dst, a, b, |s, d| widen(s, d), |s, d| narrow(s, d))
    }
}

fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl Arith for bf16 {
    #[inline]
    fn apply(op: ArithOp, a: Self, b: Self) -> Self {
        bf16_narrow(f32::apply(op, bf16_widen(a), bf16_widen(b)))
    }
    fn reduce_into(op: ArithOp, dst: &mut [Self], src: &[Self]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: `simd()` checked that the CPU has AVX2.
            return unsafe { x86::bf16_into(op, dst, src) };
        }
        bf16_into(op, dst, src)
    }
    fn reduce3(op: ArithOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: `simd()` checked that the CPU has AVX2.
            return unsafe { x86::bf16_3(op, dst, a, b) };
        }
        bf16_3(op, dst, a, b)
    }
    fn div_assign(buf: &mut [Self], n: usize) {
        let n = n.max(1) as f32;
        for x in buf {
            *x = bf16_narrow(bf16_widen(*x) / n);
        }
    }
}

impl Arith for f16 {
    #[inline]
    fn apply(op: ArithOp, a: Self, b: Self) -> Self {
        f16::from_f32(f32::apply(op, a.to_f32(), b.to_f32()))
    }
    fn reduce_into(op: ArithOp, dst: &mut [Self], src: &[Self]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: `simd()` checked that the CPU has AVX2 and F16C.
            return unsafe { x86::f16_blocks(op, dst, None, src) };
        }
        f16_portable(op, dst, None, src)
    }
    fn reduce3(op: ArithOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: `simd()` checked that the CPU has AVX2 and F16C.
            return unsafe { x86::f16_blocks(op, dst, Some(a), b) };
        }
        f16_portable(op, dst, Some(a), b)
    }
    fn div_assign(buf: &mut [Self], n: usize) {
        let n = n.max(1) as f32;
        for x in buf {
            *x = f16::from_f32(x.to_f32() / n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written bf16 rounding agrees with `half` on every bf16 value,
    /// on values between them, and on NaN and infinities.
    #[test]
    fn bf16_conversions_match_half() {
        let mut xs: Vec<f32> = (0..=u16::MAX).map(|b| bf16::from_bits(b).to_f32()).collect();
        xs.extend((0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE]);
        for x in xs {
            let (got, want) = (bf16_narrow(x), bf16::from_f32(x));
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{x}: {got} vs {want}");
            assert!(bf16_widen(got).to_bits() == got.to_f32().to_bits() || got.is_nan());
        }
    }

    /// The SIMD and portable paths give identical bits.
    #[test]
    fn simd_and_portable_paths_agree() {
        let xs: Vec<f32> = (0..1037).map(|i| ((i * 7919) % 2003) as f32 / 37.0 - 27.0).collect();
        let ys: Vec<f32> = (0..1037).map(|i| ((i * 104_729) % 1999) as f32 / 53.0 - 18.0).collect();
        for op in [ArithOp::Sum, ArithOp::Prod, ArithOp::Min, ArithOp::Max] {
            let (a, b): (Vec<f16>, Vec<f16>) =
                (xs.iter().map(|&x| f16::from_f32(x)).collect(), ys.iter().map(|&y| f16::from_f32(y)).collect());
            let mut p = vec![f16::ZERO; a.len()];
            f16_portable(op, &mut p, Some(&a), &b);
            let mut s = vec![f16::ZERO; a.len()];
            f16::reduce3(op, &mut s, &a, &b);
            assert_eq!(p, s, "f16 {op:?}");
            let (a, b): (Vec<bf16>, Vec<bf16>) =
                (xs.iter().map(|&x| bf16::from_f32(x)).collect(), ys.iter().map(|&y| bf16::from_f32(y)).collect());
            let mut p = a.clone();
            bf16_into(op, &mut p, &b);
            let mut s = a.clone();
            bf16::reduce_into(op, &mut s, &b);
            assert_eq!(p, s, "bf16 {op:?}");
        }
    }
}
