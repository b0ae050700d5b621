//! Copies that write around the cache, for outputs larger than it.
//!
//! An ordinary store first reads the destination line into the cache (a
//! read for ownership), so copying `n` bytes into memory that is not cached
//! moves `3n` bytes through DRAM. Non-temporal stores skip that read and
//! do not evict data still to be used; `memcpy` switches to them for large
//! copies, but a collective copies a slot at a time and never gets there.

/// Copies `src` into `dst` (the shorter length wins) with non-temporal
/// stores where the CPU has them (x86-64), then fences, so the copy is
/// ordered before any later store (a slot's publication, for one).
pub fn copy_around_cache<T: Copy>(dst: &mut [T], src: &[T]) {
    copy_around_cache_unfenced(dst, src);
    fence_streams();
}

/// [`copy_around_cache`] without the fence: for a run of copies that
/// [`fence_streams`] orders once, at its end. Until then, later stores
/// may become visible to other cores before these.
pub fn copy_around_cache_unfenced<T: Copy>(dst: &mut [T], src: &[T]) {
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(dst);
        // SAFETY: both slices span `bytes` bytes and do not overlap (one is
        // borrowed mutably); any bit pattern of a `T: Copy` copied whole is
        // that `T` again.
        unsafe { x86::copy(dst.as_mut_ptr().cast(), src.as_ptr().cast(), bytes) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// Copies `bytes` bytes: the unaligned head and tail with ordinary
    /// stores, the 16-byte aligned middle with streaming stores.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes and `src` for reads of `bytes` bytes,
    /// and the two must not overlap.
    pub unsafe fn copy(dst: *mut u8, src: *const u8, bytes: usize) {
        let head = dst.align_offset(16).min(bytes);
        // SAFETY: within the caller's `bytes`, non-overlapping (contract).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let blocks = (bytes - head) / 16;
        for i in 0..blocks {
            let off = head + 16 * i;
            // SAFETY: `off + 16 <= bytes`; `dst + off` is 16-byte aligned
            // (the head made it so); SSE2 is part of x86-64.
            unsafe {
                let v = _mm_loadu_si128(src.add(off) as *const __m128i);
                _mm_stream_si128(dst.add(off) as *mut __m128i, v);
            }
        }
        let done = head + 16 * blocks;
        // SAFETY: the remaining `bytes - done` bytes, as above.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), bytes - done) };
    }

    /// Orders the streaming stores before all later stores.
    pub fn fence() {
        // SAFETY: a fence has no memory operands; SSE is part of x86-64.
        unsafe { _mm_sfence() };
    }
}

/// Orders every streaming store of this thread before its later stores.
pub fn fence_streams() {
    #[cfg(target_arch = "x86_64")]
    x86::fence();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_alignment_exactly() {
        let src: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..17 {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 300, 583 - off] {
                let mut dst = vec![0xAAu8; 600];
                copy_around_cache(&mut dst[off..off + len], &src[..len]);
                assert_eq!(&dst[off..off + len], &src[..len], "offset {off}, {len} bytes");
                assert!(dst[..off].iter().chain(&dst[off + len..]).all(|&b| b == 0xAA), "nothing else written");
            }
        }
        let mut f = vec![0f64; 1000];
        let g: Vec<f64> = (0..1000).map(|i| i as f64 * 0.5).collect();
        copy_around_cache(&mut f[1..], &g);
        assert_eq!(&f[1..], &g[..999]);
    }
}
