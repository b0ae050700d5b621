//! Bitwise and, or and xor for the integer element types.

use crate::{zip3, zip_into, BitOp};

/// An integer element type with the three bitwise reductions.
pub trait Bitwise: Copy + Send + Sync + 'static {
    /// `a ⊕ b` for one pair of elements.
    fn apply_bits(op: BitOp, a: Self, b: Self) -> Self;
    /// `dst[i] = dst[i] ⊕ src[i]` over the common length.
    fn bits_into(op: BitOp, dst: &mut [Self], src: &[Self]);
    /// `dst[i] = a[i] ⊕ b[i]` over the common length.
    fn bits3(op: BitOp, dst: &mut [Self], a: &[Self], b: &[Self]);
}

macro_rules! int_bits {
    ($($t:ty),*) => {$(
        impl Bitwise for $t {
            #[inline]
            fn apply_bits(op: BitOp, a: Self, b: Self) -> Self {
                match op {
                    BitOp::And => a & b,
                    BitOp::Or => a | b,
                    BitOp::Xor => a ^ b,
                }
            }
            fn bits_into(op: BitOp, dst: &mut [Self], src: &[Self]) {
                match op {
                    BitOp::And => zip_into(dst, src, |a: $t, b: $t| a & b),
                    BitOp::Or => zip_into(dst, src, |a: $t, b: $t| a | b),
                    BitOp::Xor => zip_into(dst, src, |a: $t, b: $t| a ^ b),
                }
            }
            fn bits3(op: BitOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                match op {
                    BitOp::And => zip3(dst, a, b, |a: $t, b: $t| a & b),
                    BitOp::Or => zip3(dst, a, b, |a: $t, b: $t| a | b),
                    BitOp::Xor => zip3(dst, a, b, |a: $t, b: $t| a ^ b),
                }
            }
        }
    )*};
}

int_bits!(i8, i16, i32, i64, u8, u16, u32, u64, isize, usize);
