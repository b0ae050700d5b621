//! Reduction operators as zero-sized types.
//!
//! An operator is a type implementing [`Op`]; [`ReduceOp<T>`] says it can
//! reduce elements of `T`. A call such as `comm.all_reduce(&mut buf, Max)`
//! only compiles when `Max: ReduceOp<T>`, so an operator a type cannot do
//! (`BitAnd` on `f32`, `Avg` on a derived struct) is a compile error.
//!
//! Operators are assumed associative and commutative, as in NCCL: the
//! algorithms combine contributions in different orders on different ranks.
//!
//! A user operator is a type of your own:
//!
//! ```
//! use ccl::{Op, ReduceOp};
//!
//! /// Keeps the value of larger magnitude.
//! #[derive(Clone, Copy, Debug, Default)]
//! struct AbsMax;
//! impl Op for AbsMax {
//!     const NAME: &'static str = "absmax";
//! }
//! impl ReduceOp<f32> for AbsMax {
//!     fn combine(a: f32, b: f32) -> f32 {
//!         if b.abs() > a.abs() { b } else { a }
//!     }
//! }
//! assert_eq!(AbsMax::combine(-3.0, 2.0), -3.0);
//! ```

use crate::Reduce;
use ccl_kernels::{Arith, ArithOp, BitOp, Bitwise};
use half::{bf16, f16};
use std::fmt::Debug;

/// A reduction operator: a zero-sized type with a name.
pub trait Op: Copy + Default + Debug + Send + Sync + 'static {
    /// Name shown in messages and benchmark tables (`"sum"`).
    const NAME: &'static str;
    /// The operator's name in ccl's CUDA kernels (`"Sum"`), if it has
    /// kernels; a user operator has none and cannot run on device buffers.
    const CUDA: Option<&'static str> = None;
    /// Whether [`NAME`](Op::NAME) alone tells this operator from every
    /// other: true for ccl's own, whose names are distinct; a user
    /// operator is told apart by its type's path too, so that two
    /// operators of the same name never pass for one another.
    #[doc(hidden)]
    const NAMED_UNIQUELY: bool = false;
}

/// `Self` reduces elements of `T`.
///
/// Only [`combine`](ReduceOp::combine) is required; the slice methods loop
/// over it unless an implementation supplies vectorised kernels (the
/// primitive types do).
#[diagnostic::on_unimplemented(
    message = "the reduction `{Self}` is not defined for elements of type `{T}`",
    label = "`{Self}` cannot reduce `{T}`",
    note = "integers take Sum, Prod, Min, Max, Avg, BitAnd, BitOr, BitXor; floats take Sum, Prod, Min, Max, Avg; derived structs take Sum, Prod, Min, Max; other operators need `impl ReduceOp<{T}> for {Self}`"
)]
pub trait ReduceOp<T>: Op {
    /// `a ⊕ b`.
    fn combine(a: T, b: T) -> T;

    /// `dst[i] = dst[i] ⊕ src[i]` over the common length.
    fn reduce_into(dst: &mut [T], src: &[T])
    where
        T: Copy,
    {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = Self::combine(*d, *s);
        }
    }

    /// `dst[i] = a[i] ⊕ b[i]` over the common length.
    fn reduce3(dst: &mut [T], a: &[T], b: &[T])
    where
        T: Copy,
    {
        for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
            *d = Self::combine(*x, *y);
        }
    }

    /// Applied once to each fully reduced result (`Avg` divides by the rank
    /// count here); the identity for most operators.
    fn finish(_buf: &mut [T], _nranks: usize) {}
}

macro_rules! def_op {
    ($($(#[$doc:meta])* $name:ident = $s:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;
        impl Op for $name {
            const NAME: &'static str = $s;
            const CUDA: Option<&'static str> = Some(stringify!($name));
            const NAMED_UNIQUELY: bool = true;
        }
    )*};
}

def_op! {
    /// Sum (wrapping for integers).
    Sum = "sum";
    /// Product (wrapping for integers).
    Prod = "prod";
    /// Minimum.
    Min = "min";
    /// Maximum.
    Max = "max";
    /// Average: the sum divided by the number of ranks (truncating for integers).
    Avg = "avg";
    /// Bitwise and (integers only).
    BitAnd = "band";
    /// Bitwise or (integers only).
    BitOr = "bor";
    /// Bitwise xor (integers only).
    BitXor = "bxor";
}

macro_rules! arith_ops {
    ($($t:ty),*) => {$(
        arith_op!($t, Sum, ArithOp::Sum);
        arith_op!($t, Prod, ArithOp::Prod);
        arith_op!($t, Min, ArithOp::Min);
        arith_op!($t, Max, ArithOp::Max);
        impl ReduceOp<$t> for Avg {
            #[inline]
            fn combine(a: $t, b: $t) -> $t { <$t as Arith>::apply(ArithOp::Sum, a, b) }
            fn reduce_into(dst: &mut [$t], src: &[$t]) { <$t as Arith>::reduce_into(ArithOp::Sum, dst, src) }
            fn reduce3(dst: &mut [$t], a: &[$t], b: &[$t]) { <$t as Arith>::reduce3(ArithOp::Sum, dst, a, b) }
            fn finish(buf: &mut [$t], nranks: usize) { <$t as Arith>::div_assign(buf, nranks) }
        }
    )*};
}

macro_rules! arith_op {
    ($t:ty, $op:ident, $k:expr) => {
        impl ReduceOp<$t> for $op {
            #[inline]
            fn combine(a: $t, b: $t) -> $t {
                <$t as Arith>::apply($k, a, b)
            }
            fn reduce_into(dst: &mut [$t], src: &[$t]) {
                <$t as Arith>::reduce_into($k, dst, src)
            }
            fn reduce3(dst: &mut [$t], a: &[$t], b: &[$t]) {
                <$t as Arith>::reduce3($k, dst, a, b)
            }
        }
    };
}

macro_rules! bit_ops {
    ($($t:ty),*) => {$(
        bit_op!($t, BitAnd, BitOp::And);
        bit_op!($t, BitOr, BitOp::Or);
        bit_op!($t, BitXor, BitOp::Xor);
    )*};
}

macro_rules! bit_op {
    ($t:ty, $op:ident, $k:expr) => {
        impl ReduceOp<$t> for $op {
            #[inline]
            fn combine(a: $t, b: $t) -> $t {
                <$t as Bitwise>::apply_bits($k, a, b)
            }
            fn reduce_into(dst: &mut [$t], src: &[$t]) {
                <$t as Bitwise>::bits_into($k, dst, src)
            }
            fn reduce3(dst: &mut [$t], a: &[$t], b: &[$t]) {
                <$t as Bitwise>::bits3($k, dst, a, b)
            }
        }
    };
}

/// The operator of calls that never reduce (broadcast, gathers, p2p).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NoOp;

impl Op for NoOp {
    const NAME: &'static str = "none";
    const NAMED_UNIQUELY: bool = true;
}

impl<T: Reduce> ReduceOp<T> for NoOp {
    fn combine(a: T, _b: T) -> T {
        a
    }
}

arith_ops!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize, f32, f64, f16, bf16);
bit_ops!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitive_ops_use_the_kernels() {
        let mut v = [1i32, 5, -2];
        <Max as ReduceOp<i32>>::reduce_into(&mut v, &[3, 3, 3]);
        assert_eq!(v, [3, 5, 3]);
        let mut v = [6u8, 3];
        <BitXor as ReduceOp<u8>>::reduce_into(&mut v, &[5, 3]);
        assert_eq!(v, [3, 0]);
        let mut a = [3.0f64, 5.0];
        <Avg as ReduceOp<f64>>::reduce_into(&mut a, &[1.0, 1.0]);
        <Avg as ReduceOp<f64>>::finish(&mut a, 2);
        assert_eq!(a, [2.0, 3.0]);
    }
}
