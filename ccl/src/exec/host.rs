//! One step on host memory: the copies and reductions between the call's
//! buffers and the slots, with the vectorised kernels.

use super::Exec;
use crate::algo::{Buf, Region, Step};
use crate::op::ReduceOp;
use crate::Reduce;

impl<T: Reduce, O: ReduceOp<T>> Exec<T, O> {
    /// One step on host memory (with `next`, the step after it, where the
    /// two fuse: [`Step::fuses_with`]); how many local steps it took (0
    /// for a slot of a step with messages), and, where the outgoing
    /// connection `lends` and the step sends memory of the call as it is,
    /// that region, to be sent from there instead of a slot.
    #[inline]
    pub(super) fn host_step(
        &self,
        (st, next): (Step, Option<Step>),
        at: impl Fn(Region) -> Region,
        incoming: Option<*const T>,
        outgoing: Option<*mut T>,
        n: usize,
        lends: bool,
    ) -> (usize, Option<Region>) {
        // a message read straight into the memory it is copied to (given
        // as its place, `Exec::give_places`) is already there
        let landed = match (crate::algo::lend::landing(&st), incoming) {
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
        let around = |d: Region| self.around_cache && matches!(d.buf, Buf::Output | Buf::PeerOutput(_));
        let put = |d: Region, src: &[T]| store(around(d), mem_mut(d), src);
        let to_slot = self.slots_around;
        let mut local = 0;
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
            // a large output around the cache, and the slot's copy from
            // each reduced piece while it is still in L1
            Step::RecvReduceCopySend { src, dst, .. } if !lends && at(src) != at(dst) && around(at(dst)) => {
                reduce3_around_cache::<T, O>(mem_mut(at(dst)), mem(at(src)), slot_in, Some((slot_out, to_slot)))
            }
            Step::RecvReduceCopySend { src, dst, .. } => {
                // else the output through the cache even when large: the
                // copy into the slot (or a lending send) reads it back
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
                match next {
                    Some(Step::Reduce { src: b, .. }) if st.fuses_with(next.as_ref()) => {
                        reduce3::<T, O>(around(d), mem_mut(d), mem(s), mem(self.layout.resolve(b)));
                        local = 2;
                    }
                    _ if s != d => {
                        put(d, mem(s));
                        local = 1;
                    }
                    _ => local = 1,
                }
            }
            Step::Reduce { src, dst } => {
                let (s, d) = (self.layout.resolve(src), self.layout.resolve(dst));
                O::reduce_into(mem_mut(d), mem(s));
                local = 1;
            }
            // the message is the notice: nothing to move
            Step::Notify { .. } | Step::Wait { .. } => {}
        }
        (local, lent)
    }
}

/// `dst = src`, written `around` the cache or through it.
#[inline]
fn store<T: Copy>(around: bool, dst: &mut [T], src: &[T]) {
    store_unfenced(around, dst, src);
    if around {
        ccl_kernels::fence_streams();
    }
}

/// [`store`] without ordering streamed stores before later ones: for a run
/// of stores that [`ccl_kernels::fence_streams`] then orders once.
fn store_unfenced<T: Copy>(around: bool, dst: &mut [T], src: &[T]) {
    if around {
        ccl_kernels::copy_around_cache_unfenced(dst, src)
    } else {
        dst.copy_from_slice(src)
    }
}

/// `dst = a ⊕ b`, written `around` the cache or through it.
fn reduce3<T: Reduce, O: ReduceOp<T>>(around: bool, dst: &mut [T], a: &[T], b: &[T]) {
    if around {
        reduce3_around_cache::<T, O>(dst, a, b, None)
    } else {
        O::reduce3(dst, a, b)
    }
}

/// `dst = a ⊕ b` with `dst` written around the cache, and the same into
/// `copy` if given (around the cache too if its flag says): reduced a few
/// KiB at a time into a buffer that stays in L1, then stored from there.
fn reduce3_around_cache<T: Reduce, O: ReduceOp<T>>(
    dst: &mut [T],
    a: &[T],
    b: &[T],
    mut copy: Option<(&mut [T], bool)>,
) {
    #[repr(C, align(64))]
    struct Chunk([u8; 4096]);
    let per = 4096 / std::mem::size_of::<T>();
    if per == 0 {
        O::reduce3(dst, a, b);
        if let Some((c, around)) = copy {
            store(around, c, dst);
        }
        return;
    }
    let mut c = Chunk([0; 4096]);
    // SAFETY: 4096 initialised bytes, 64-byte aligned (a `T` is aligned to
    // at most 64, checked in `Exec::new`), hold `per` elements; every bit
    // pattern is a valid `T` (the `Reduce` contract).
    let tmp = unsafe { std::slice::from_raw_parts_mut(c.0.as_mut_ptr() as *mut T, per) };
    for (i, ((d, x), y)) in dst.chunks_mut(per).zip(a.chunks(per)).zip(b.chunks(per)).enumerate() {
        let t = &mut tmp[..d.len()];
        O::reduce3(t, x, y);
        ccl_kernels::copy_around_cache_unfenced(d, t);
        if let Some((c, around)) = copy.as_mut() {
            store_unfenced(*around, &mut c[i * per..i * per + t.len()], t);
        }
    }
    // one fence for the whole run: one a piece stalled each for the
    // streaming stores before it to drain
    ccl_kernels::fence_streams();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Max, Sum};

    fn check<T: Reduce + PartialEq + std::fmt::Debug, O: ReduceOp<T>>(
        draw: impl Fn(usize) -> T,
        op: impl Fn(T, T) -> T,
    ) {
        // one piece, several, and a short last one; none at all
        for n in [0, 1, 1000, 1024, 1025, 5000] {
            let a: Vec<T> = (0..n).map(&draw).collect();
            let b: Vec<T> = (0..n).map(|i| draw(i * 7 + n)).collect();
            let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| op(x, y)).collect();
            for copy in [None, Some(false), Some(true)] {
                let (mut dst, mut slot) = (vec![draw(1); n], vec![draw(2); n]);
                reduce3_around_cache::<T, O>(&mut dst, &a, &b, copy.map(|around| (&mut slot[..], around)));
                assert_eq!(dst, want, "{n} elements, copy {copy:?}");
                if copy.is_some() {
                    assert_eq!(slot, want, "{n} elements, copy {copy:?}");
                }
            }
        }
    }

    #[test]
    fn reducing_around_the_cache_writes_the_output_and_the_copy() {
        let seed = rand::random::<u64>();
        let draw = move |i: usize| (seed.wrapping_mul(i as u64 + 1) >> 40) as f32;
        check::<f32, Sum>(draw, |x, y| x + y);
        check::<u8, Max>(move |i| (seed >> (i % 56)) as u8, |x, y| x.max(y));
        check::<f64, Sum>(move |i| draw(i) as f64 * 0.5, |x, y| x + y);
    }
}
