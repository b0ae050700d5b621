//! Sum, product, min and max for every primitive element type.

use crate::{zip3, zip_into, ArithOp};

/// An element type with the four arithmetic reductions and division by a
/// rank count (for averages).
pub trait Arith: Copy + Send + Sync + 'static {
    /// `a ⊕ b` for one pair of elements.
    fn apply(op: ArithOp, a: Self, b: Self) -> Self;
    /// `dst[i] = dst[i] ⊕ src[i]` over the common length.
    fn reduce_into(op: ArithOp, dst: &mut [Self], src: &[Self]);
    /// `dst[i] = a[i] ⊕ b[i]` over the common length.
    fn reduce3(op: ArithOp, dst: &mut [Self], a: &[Self], b: &[Self]);
    /// `buf[i] = buf[i] / n` (integer division truncates toward zero).
    fn div_assign(buf: &mut [Self], n: usize);
}

/// Expands the four loops with the operator chosen once, outside the loop.
macro_rules! arith_dispatch {
    ($op:expr, $call:ident, $($args:expr),+; $add:expr, $mul:expr, $min:expr, $max:expr) => {
        match $op {
            ArithOp::Sum => $call($($args),+, $add),
            ArithOp::Prod => $call($($args),+, $mul),
            ArithOp::Min => $call($($args),+, $min),
            ArithOp::Max => $call($($args),+, $max),
        }
    };
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline]
            fn apply(op: ArithOp, a: Self, b: Self) -> Self {
                match op {
                    ArithOp::Sum => a.wrapping_add(b),
                    ArithOp::Prod => a.wrapping_mul(b),
                    ArithOp::Min => a.min(b),
                    ArithOp::Max => a.max(b),
                }
            }
            fn reduce_into(op: ArithOp, dst: &mut [Self], src: &[Self]) {
                arith_dispatch!(op, zip_into, dst, src;
                    |a: $t, b: $t| a.wrapping_add(b), |a: $t, b: $t| a.wrapping_mul(b),
                    |a: $t, b: $t| a.min(b), |a: $t, b: $t| a.max(b))
            }
            fn reduce3(op: ArithOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                arith_dispatch!(op, zip3, dst, a, b;
                    |a: $t, b: $t| a.wrapping_add(b), |a: $t, b: $t| a.wrapping_mul(b),
                    |a: $t, b: $t| a.min(b), |a: $t, b: $t| a.max(b))
            }
            fn div_assign(buf: &mut [Self], n: usize) {
                let n = n.max(1) as i128;
                for x in buf {
                    // i128 holds every value of every integer type and every
                    // rank count, so neither the cast nor the division wraps.
                    *x = ((*x as i128) / n) as $t;
                }
            }
        }
    )*};
}

int_arith!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline]
            fn apply(op: ArithOp, a: Self, b: Self) -> Self {
                match op {
                    ArithOp::Sum => a + b,
                    ArithOp::Prod => a * b,
                    ArithOp::Min => a.min(b),
                    ArithOp::Max => a.max(b),
                }
            }
            fn reduce_into(op: ArithOp, dst: &mut [Self], src: &[Self]) {
                arith_dispatch!(op, zip_into, dst, src;
                    |a: $t, b: $t| a + b, |a: $t, b: $t| a * b,
                    |a: $t, b: $t| a.min(b), |a: $t, b: $t| a.max(b))
            }
            fn reduce3(op: ArithOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                arith_dispatch!(op, zip3, dst, a, b;
                    |a: $t, b: $t| a + b, |a: $t, b: $t| a * b,
                    |a: $t, b: $t| a.min(b), |a: $t, b: $t| a.max(b))
            }
            fn div_assign(buf: &mut [Self], n: usize) {
                let n = n.max(1) as $t;
                for x in buf {
                    *x /= n;
                }
            }
        }
    )*};
}

float_arith!(f32, f64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_wrap_and_divide_without_overflow() {
        let mut v = [i8::MAX, -128, 7];
        i8::reduce_into(ArithOp::Sum, &mut v, &[1, -1, 1]);
        assert_eq!(v, [i8::MIN, 127, 8]);
        let mut v = [-128i8, 100, -7];
        i8::div_assign(&mut v, 200);
        assert_eq!(v, [0, 0, 0]);
        let mut v = [u64::MAX];
        u64::div_assign(&mut v, 3);
        assert_eq!(v, [u64::MAX / 3]);
    }

    #[test]
    fn float_min_max_ignore_nan() {
        assert_eq!(f32::apply(ArithOp::Min, f32::NAN, 1.0), 1.0);
        assert_eq!(f64::apply(ArithOp::Max, 2.0, f64::NAN), 2.0);
    }
}
