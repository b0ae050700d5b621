//! Element types: the [`Reduce`] trait and its implementations for the
//! primitive numeric types.

use half::{bf16, f16};

/// An element type ccl can move and reduce.
///
/// Implemented for every integer type, `f32`, `f64`, [`half::f16`],
/// [`half::bf16`], and for structs through `#[derive(Reduce)]`, which checks
/// that every field is itself `Reduce` and derives field-wise [`Sum`],
/// [`Prod`], [`Min`] and [`Max`] (with per-field overrides:
/// `#[reduce(max)]`).
///
/// # Safety
///
/// Values of `Self` are moved between ranks as raw bytes. An implementation
/// promises that `Self` is plain data: no pointers, references or handles,
/// no drop glue, and **every bit pattern of its non-padding bytes is a valid
/// value** (so `bool`, `char` and enums are not `Reduce`), including all
/// zeroes. The size must not be zero. The derive upholds this by requiring
/// every field to be `Reduce`.
///
/// [`Sum`]: crate::Sum
/// [`Prod`]: crate::Prod
/// [`Min`]: crate::Min
/// [`Max`]: crate::Max
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be reduced by ccl: it does not implement `ccl::Reduce`",
    label = "not a ccl element type",
    note = "ccl reduces integers, f32, f64, half::f16, half::bf16, and structs with `#[derive(Reduce)]` whose fields are all `Reduce`"
)]
pub unsafe trait Reduce: Copy + Send + Sync + 'static {
    /// A stable name of the type (`"f32"`, `"my_crate::Moments"`), used in
    /// messages and to tell element types apart across ranks.
    const NAME: &'static str;

    /// The type's name in CUDA C, appending to `defs` any definitions it
    /// needs (a derived struct's layout and field-wise operators; see
    /// [`gpu::codegen`](crate::gpu::codegen)); `None` if it has no GPU kernels.
    /// The derive and the primitive types provide it.
    fn cuda_type(_defs: &mut String) -> Option<String> {
        None
    }

    /// The all-zero value.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract says every bit pattern, all zeroes
        // included, is a valid value of `Self`.
        unsafe { std::mem::zeroed() }
    }
}

macro_rules! primitive_reduce {
    ($($t:ty => $cuda:literal),*) => {$(
        // SAFETY: a primitive number: plain data, every bit pattern valid.
        unsafe impl Reduce for $t {
            const NAME: &'static str = stringify!($t);
            fn cuda_type(_defs: &mut String) -> Option<String> {
                Some($cuda.into())
            }
        }
    )*};
}

primitive_reduce!(i8 => "i8", i16 => "i16", i32 => "i32", i64 => "i64", u8 => "u8", u16 => "u16", u32 => "u32",
    u64 => "u64", f32 => "f32", f64 => "f64", f16 => "f16", bf16 => "bf16");
#[cfg(target_pointer_width = "64")]
primitive_reduce!(isize => "i64", usize => "u64");
#[cfg(not(target_pointer_width = "64"))]
primitive_reduce!(isize => "i32", usize => "u32");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_types_apart() {
        assert_eq!(<f32 as Reduce>::NAME, "f32");
        assert_ne!(<f32 as Reduce>::NAME, <i32 as Reduce>::NAME);
        assert_eq!(<bf16 as Reduce>::zeroed(), bf16::ZERO);
    }
}
