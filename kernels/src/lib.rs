//! Element-wise reduction and copy kernels for ccl.
//!
//! Every collective in ccl ends up in one of three loops: `dst = dst ⊕ src`
//! ([`Arith::reduce_into`]), `dst = a ⊕ b` ([`Arith::reduce3`]) and a plain
//! copy ([`copy`]). They are written as simple zipped loops over slices with
//! the operator chosen *outside* the loop, so that the compiler vectorises
//! each (type, op) pair. `f16` and `bf16` are widened to `f32` in small
//! blocks on the stack, reduced there, and rounded back once per element.
//!
//! Integer arithmetic wraps (like C's unsigned arithmetic and like NCCL);
//! float min/max follow IEEE 754 `minNum`/`maxNum` (a NaN loses against a
//! number). The CUDA versions of these kernels will live beside this crate.

#![deny(missing_docs)]

mod arith;
mod bitwise;
pub mod cuda;
mod half_block;
mod stream;

pub use arith::Arith;
pub use bitwise::Bitwise;
pub use stream::{copy_around_cache, copy_around_cache_unfenced, fence_streams};

/// Arithmetic reductions every element type supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArithOp {
    /// `a + b` (wrapping for integers).
    Sum,
    /// `a * b` (wrapping for integers).
    Prod,
    /// The smaller of the two.
    Min,
    /// The larger of the two.
    Max,
}

/// Bitwise reductions, defined for integer types only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BitOp {
    /// `a & b`.
    And,
    /// `a | b`.
    Or,
    /// `a ^ b`.
    Xor,
}

/// Copies `src` into `dst` (the shorter length wins). A thin wrapper over
/// `copy_from_slice` so that callers name one kernel for every move.
#[inline]
pub fn copy<T: Copy>(dst: &mut [T], src: &[T]) {
    let n = dst.len().min(src.len());
    dst[..n].copy_from_slice(&src[..n]);
}

/// Applies `f` element-wise: `dst[i] = f(dst[i], src[i])` over the common
/// length. The closure is inlined, so each instantiation is a tight loop the
/// compiler vectorises.
#[inline(always)]
pub(crate) fn zip_into<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

/// Applies `f` element-wise: `dst[i] = f(a[i], b[i])` over the common length.
#[inline(always)]
pub(crate) fn zip3<T: Copy>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}
