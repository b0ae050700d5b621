//! One step on host memory: the copies and reductions between the call's
//! buffers and the slots, with the vectorised kernels.

use super::Exec;
use crate::algo::{Buf, Region, Step};
use crate::op::ReduceOp;
use crate::Reduce;

impl<T: Reduce, O: ReduceOp<T>> Exec<T, O> {
    /// One step on host memory; whether it was a local one, and, where the
    /// outgoing connection `lends` and the step sends memory of the call
    /// as it is, that region, to be sent from there instead of a slot.
    #[inline]
    pub(super) fn host_step(
        &self,
        st: Step,
        at: impl Fn(Region) -> Region,
        incoming: Option<*const T>,
        outgoing: Option<*mut T>,
        n: usize,
        lends: bool,
    ) -> (bool, Option<Region>) {
        // a message read straight into the memory it is copied to (given
        // as its place, `Exec::give_places`) is already there
        let landed = match (super::wiring::landing(&st), incoming) {
            (Some(d), Some(p)) => std::ptr::eq(p, self.ptr(at(d))),
            _ => false,
        };
        // Why the slices below are sound: regions were validated against
        // their buffers in `new`, and fused operands are identical (the
        // `s == d` branches use one slice) or disjoint; a peeked slot holds
        // `n` elements (checked in `step`) and is ours until released; a
        // reserved slot holds at least `slot_elems ≥ n` elements (checked in
        // `new`) and is ours until posted; slots are 64-byte aligned and T's
        // alignment is at most 64; every bit pattern is a valid T. A message
        // that landed is the destination itself, never also taken as a slot.
        let slot_in: &[T] = match incoming {
            // SAFETY: see above: a peeked slot of `n` elements, ours until released.
            Some(p) if !landed => unsafe { std::slice::from_raw_parts(p, n) },
            _ => &[],
        };
        let slot_out: &mut [T] = match outgoing {
            // SAFETY: see above: a reserved slot of at least `n` elements, ours until posted.
            Some(p) => unsafe { std::slice::from_raw_parts_mut(p, n) },
            None => &mut [],
        };
        // SAFETY: see above: a validated region, not aliased by a live `mem_mut` slice.
        let mem = |r: Region| unsafe { std::slice::from_raw_parts(self.ptr(r) as *const T, r.len) };
        // SAFETY: see above: a validated region, disjoint from every other live slice.
        let mem_mut = |r: Region| unsafe { std::slice::from_raw_parts_mut(self.ptr(r), r.len) };
        // writes into a large output, and into slots when so asked, go
        // around the cache
        let around = |d: Region| self.around_cache && d.buf == Buf::Output;
        let put = |d: Region, src: &[T]| store(around(d), mem_mut(d), src);
        let to_slot = self.slots_around;
        let mut local = false;
        let mut lent = None;
        match st {
            Step::Send { src, .. } if lends => lent = Some(at(src)),
            Step::Send { src, .. } => store(to_slot, slot_out, mem(at(src))),
            Step::Recv { .. } if landed => {}
            Step::Recv { dst, .. } => put(at(dst), slot_in),
            Step::RecvReduce { src, dst, .. } => {
                let (s, d) = (at(src), at(dst));
                if s == d {
                    O::reduce_into(mem_mut(d), slot_in);
                } else {
                    reduce3::<T, O>(around(d), mem_mut(d), mem(s), slot_in);
                }
            }
            Step::RecvReduceSend { src, .. } => reduce3::<T, O>(to_slot, slot_out, mem(at(src)), slot_in),
            Step::RecvReduceCopySend { src, dst, .. } => {
                // the output through the cache even when large: the copy
                // into the slot reads it straight back
                let (s, d) = (at(src), at(dst));
                if s == d {
                    O::reduce_into(mem_mut(d), slot_in);
                } else {
                    O::reduce3(mem_mut(d), mem(s), slot_in);
                }
                if lends {
                    lent = Some(d);
                } else {
                    store(to_slot, slot_out, mem(d));
                }
            }
            Step::RecvCopySend { dst, .. } if landed => {
                let d = at(dst);
                if lends {
                    lent = Some(d);
                } else {
                    store(to_slot, slot_out, mem(d));
                }
            }
            Step::RecvCopySend { dst, .. } => {
                let d = at(dst);
                put(d, slot_in);
                if lends {
                    lent = Some(d);
                } else {
                    store(to_slot, slot_out, slot_in);
                }
            }
            Step::Copy { src, dst } => {
                let (s, d) = (self.layout.resolve(src), self.layout.resolve(dst));
                if s != d {
                    put(d, mem(s));
                }
                local = true;
            }
            Step::Reduce { src, dst } => {
                let (s, d) = (self.layout.resolve(src), self.layout.resolve(dst));
                O::reduce_into(mem_mut(d), mem(s));
                local = true;
            }
        }
        (local, lent)
    }
}

/// `dst = src`, written `around` the cache or through it.
pub(crate) fn store<T: Copy>(around: bool, dst: &mut [T], src: &[T]) {
    if around {
        ccl_kernels::copy_around_cache(dst, src)
    } else {
        dst.copy_from_slice(src)
    }
}

/// `dst = a ⊕ b`, written `around` the cache or through it.
fn reduce3<T: Reduce, O: ReduceOp<T>>(around: bool, dst: &mut [T], a: &[T], b: &[T]) {
    if around {
        reduce3_around_cache::<T, O>(dst, a, b)
    } else {
        O::reduce3(dst, a, b)
    }
}

/// `dst = a ⊕ b` with `dst` written around the cache: reduced a few KiB
/// at a time into a buffer that stays in L1, then streamed out.
fn reduce3_around_cache<T: Reduce, O: ReduceOp<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    #[repr(C, align(64))]
    struct Chunk([u8; 4096]);
    let per = 4096 / std::mem::size_of::<T>();
    if per == 0 {
        return O::reduce3(dst, a, b);
    }
    let mut c = Chunk([0; 4096]);
    // SAFETY: 4096 initialised bytes, 64-byte aligned (a `T` is aligned to
    // at most 64, checked in `Exec::new`), hold `per` elements; every bit
    // pattern is a valid `T` (the `Reduce` contract).
    let tmp = unsafe { std::slice::from_raw_parts_mut(c.0.as_mut_ptr() as *mut T, per) };
    for ((d, x), y) in dst.chunks_mut(per).zip(a.chunks(per)).zip(b.chunks(per)) {
        let t = &mut tmp[..d.len()];
        O::reduce3(t, x, y);
        ccl_kernels::copy_around_cache(d, t);
    }
}
