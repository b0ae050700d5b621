//! A connection end's ring of slots, in this process's memory.

use crate::error::{Error, Result};
use crate::transport::Geometry;
use std::alloc::{alloc_zeroed, dealloc, Layout};

/// A ring of 64-byte-aligned slots in this process's memory.
pub(super) struct Slots {
    pub(super) base: *mut u8,
    pub(super) layout: Layout,
    pub(super) slot_bytes: usize,
    pub(super) n: usize,
}

// SAFETY: the ring is owned by one connection end and only touched through
// it (`&mut self`); the pointer is freed once, on drop.
unsafe impl Send for Slots {}

impl Slots {
    /// `ring.nslots` slots (at least one) of `ring.slot_bytes` rounded up to 64.
    pub(super) fn new(ring: Geometry) -> Result<Self> {
        let (n, slot_bytes) = (ring.nslots.max(1), ring.slot_bytes.div_ceil(64) * 64);
        let layout =
            Layout::from_size_align((n * slot_bytes).max(64), 64).map_err(|_| Error::internal("slot layout"))?;
        // SAFETY: non-zero size.
        let base = unsafe { alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::transport("cannot allocate tcp slots"));
        }
        Ok(Slots { base, layout, slot_bytes, n })
    }
    pub(super) fn ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: `i % n < n`, inside the allocation.
        unsafe { self.base.add((i % self.n) * self.slot_bytes) }
    }
    pub(super) fn bytes(&mut self, i: usize, len: usize) -> &mut [u8] {
        // SAFETY: a slot of `slot_bytes ≥ len` bytes (callers check), owned by this ring.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i), len.min(self.slot_bytes)) }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.base, self.layout) }
    }
}
