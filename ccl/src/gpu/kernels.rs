//! Which kernels a call of element type `T` and operator `O` runs: their
//! names, the CUDA source that has them (the shared file for primitive
//! types, generated for derived structs), and host versions of the same
//! operations for the emulated device.

use crate::error::{Error, ErrorKind, Result};
use crate::op::ReduceOp;
use crate::Reduce;
use ccl_kernels::cuda::{codegen, SOURCE, TYPES};
use std::sync::Arc;

/// `dst = a ⊕ b` on host memory; `dst` may equal `a` or `b`.
type HostReduce = unsafe fn(dst: *mut u8, a: *const u8, b: *const u8, n: usize);
/// The finishing pass on host memory.
type HostFinish = unsafe fn(buf: *mut u8, n: usize, ranks: usize);

/// The kernels of one (element type, operator) pair.
#[derive(Clone, Debug)]
pub struct Kernels {
    /// The CUDA source holding them.
    pub source: Arc<str>,
    /// The element type's CUDA name.
    pub ty: String,
    /// Element size in bytes.
    pub elem: usize,
    /// `ccl_reduce_<op>_<type>`, if the call reduces.
    pub reduce: Option<String>,
    /// `ccl_recv_reduce_send_<op>_<type>`, if the call reduces.
    pub recv_reduce_send: Option<String>,
    /// `ccl_div_<type>` for Avg.
    pub div: Option<String>,
    pub(crate) host_reduce: HostReduce,
    pub(crate) host_finish: HostFinish,
}

/// # Safety
/// Each pointer is valid for `n` elements of `T`; `dst` equals `a` or `b` or overlaps neither.
unsafe fn host_reduce<T: Reduce, O: ReduceOp<T>>(dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    let (d, a, b) = (dst as *mut T, a as *const T, b as *const T);
    // SAFETY: per the contract; aliasing operands are handled by the
    // in-place forms, so no `&mut` overlaps a live `&`.
    unsafe {
        let dst = std::slice::from_raw_parts_mut(d, n);
        if std::ptr::eq(d as *const T, a) {
            O::reduce_into(dst, std::slice::from_raw_parts(b, n));
        } else if std::ptr::eq(d as *const T, b) {
            // operators are commutative
            O::reduce_into(dst, std::slice::from_raw_parts(a, n));
        } else {
            O::reduce3(dst, std::slice::from_raw_parts(a, n), std::slice::from_raw_parts(b, n));
        }
    }
}

/// # Safety
/// `buf` is valid for `n` elements of `T`.
unsafe fn host_finish<T: Reduce, O: ReduceOp<T>>(buf: *mut u8, n: usize, ranks: usize) {
    // SAFETY: per the contract.
    O::finish(unsafe { std::slice::from_raw_parts_mut(buf as *mut T, n) }, ranks);
}

impl Kernels {
    /// The entry point `l` launches; an error if this call has no such
    /// kernel (a reduction in a call without an operator: a bug).
    pub fn name_of(&self, l: &super::Launch) -> Result<&str> {
        let name = match l {
            super::Launch::Reduce { .. } => &self.reduce,
            super::Launch::RecvReduceSend { .. } => &self.recv_reduce_send,
            super::Launch::Div { .. } => &self.div,
        };
        name.as_deref().ok_or_else(|| Error::internal(format!("{l:?} in a call whose operator has no such kernel")))
    }

    /// The kernels for `T` and `O`, or an error naming what has none (a
    /// user operator, a type whose `Reduce` gives no CUDA type).
    pub fn of<T: Reduce, O: ReduceOp<T>>() -> Result<Self> {
        let mut defs = String::new();
        let ty = T::cuda_type(&mut defs).ok_or_else(|| {
            Error::new(ErrorKind::Unsupported(format!(
                "element type {} has no GPU kernels (its Reduce implementation gives no cuda_type)",
                T::NAME
            )))
        })?;
        let primitive = defs.is_empty() && TYPES.contains(&ty.as_str());
        let source: Arc<str> = if primitive { Arc::from(SOURCE) } else { Arc::from(codegen::source(&defs, &ty)) };
        let (op, div) = match O::CUDA {
            Some("Avg") if primitive => (Some("Sum"), Some(format!("ccl_div_{ty}"))),
            Some("Avg") | None if O::NAME != "none" => {
                return Err(Error::new(ErrorKind::Unsupported(format!(
                    "operator {} has no GPU kernel for {}",
                    O::NAME,
                    T::NAME
                ))))
            }
            Some(op) => (Some(op), None),
            None => (None, None),
        };
        Ok(Kernels {
            source,
            elem: std::mem::size_of::<T>(),
            reduce: op.map(|o| format!("ccl_reduce_{o}_{ty}")),
            recv_reduce_send: op.map(|o| format!("ccl_recv_reduce_send_{o}_{ty}")),
            div,
            ty,
            host_reduce: host_reduce::<T, O>,
            host_finish: host_finish::<T, O>,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Avg, BitXor, Max, Sum};

    #[test]
    fn primitive_and_avg_kernels_are_named() {
        let k = Kernels::of::<f32, Avg>().expect("must succeed");
        assert_eq!(k.reduce.as_deref(), Some("ccl_reduce_Sum_f32"));
        assert_eq!(k.div.as_deref(), Some("ccl_div_f32"));
        assert!(k.source.contains("CCL_ARITH(f32)"));
        let k = Kernels::of::<usize, BitXor>().expect("must succeed");
        assert_eq!(k.recv_reduce_send.as_deref(), Some("ccl_recv_reduce_send_BitXor_u64"));
        let k = Kernels::of::<half::bf16, Max>().expect("must succeed");
        assert_eq!(k.reduce.as_deref(), Some("ccl_reduce_Max_bf16"));
        let k = Kernels::of::<u8, crate::op::NoOp>().expect("must succeed");
        assert!(k.reduce.is_none() && k.div.is_none());
    }

    #[derive(Clone, Copy, Debug, Default)]
    struct Odd;
    impl crate::Op for Odd {
        const NAME: &'static str = "odd";
    }
    impl ReduceOp<f32> for Odd {
        fn combine(a: f32, _b: f32) -> f32 {
            a
        }
    }

    #[test]
    fn a_user_operator_has_no_gpu_kernel() {
        let e = Kernels::of::<f32, Odd>().expect_err("must fail");
        assert!(e.to_string().contains("operator odd has no GPU kernel for f32"), "{e}");
        assert!(Kernels::of::<f32, Sum>().is_ok());
    }
}
