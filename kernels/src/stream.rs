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
    use std::arch::x86_64::{
        __m128i, __m512i, _mm512_loadu_si512, _mm512_stream_si512, _mm_loadu_si128, _mm_sfence, _mm_stream_si128,
    };

    /// Copies `bytes` bytes: the unaligned head and tail with ordinary
    /// stores, the aligned middle with streaming stores, as wide as the CPU
    /// has them.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes and `src` for reads of `bytes` bytes,
    /// and the two must not overlap.
    pub unsafe fn copy(dst: *mut u8, src: *const u8, bytes: usize) {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the caller's contract; the CPU has AVX-512F (checked).
            unsafe { copy_lines(dst, src, bytes) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { copy_blocks(dst, src, bytes) }
        }
    }

    /// [`copy`] 16 bytes a store (SSE2, which every x86-64 CPU has).
    ///
    /// # Safety
    ///
    /// As [`copy`].
    pub unsafe fn copy_blocks(dst: *mut u8, src: *const u8, bytes: usize) {
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

    /// [`copy`] a cache line a store: the 64-byte aligned middle with
    /// AVX-512 streaming stores.
    ///
    /// # Safety
    ///
    /// As [`copy`]; and the CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn copy_lines(dst: *mut u8, src: *const u8, bytes: usize) {
        let head = dst.align_offset(64).min(bytes);
        // SAFETY: within the caller's `bytes`, non-overlapping (contract).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let blocks = (bytes - head) / 64;
        for i in 0..blocks {
            let off = head + 64 * i;
            // SAFETY: `off + 64 <= bytes`; `dst + off` is 64-byte aligned
            // (the head made it so); AVX-512F is enabled (contract).
            unsafe {
                let v = _mm512_loadu_si512(src.add(off) as *const __m512i);
                _mm512_stream_si512(dst.add(off) as *mut __m512i, v);
            }
        }
        let done = head + 64 * blocks;
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
        // every offset within a cache line, by each width of stores this CPU has
        type Way = unsafe fn(*mut u8, *const u8, usize);
        let mut ways: Vec<(&str, Way)> = vec![("any", |d, s, n| {
            // SAFETY: as the callers below promise
            let (d, s) = unsafe { (std::slice::from_raw_parts_mut(d, n), std::slice::from_raw_parts(s, n)) };
            copy_around_cache(d, s)
        })];
        #[cfg(target_arch = "x86_64")]
        {
            ways.push(("16 B", x86::copy_blocks));
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F is there (checked); the rest as the callers below promise
                ways.push(("64 B", |d, s, n| unsafe { x86::copy_lines(d, s, n) }));
            }
        }
        for (way, copy) in ways {
            for off in 0..65 {
                for len in [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 300, 535 - off] {
                    let mut dst = vec![0xAAu8; 600];
                    // SAFETY: `len` bytes of `src`, and of `dst` from `off` (off + len <= 600), distinct vectors
                    unsafe { copy(dst[off..].as_mut_ptr(), src.as_ptr(), len) };
                    assert_eq!(&dst[off..off + len], &src[..len], "{way}: offset {off}, {len} bytes");
                    let rest = dst[..off].iter().chain(&dst[off + len..]);
                    assert!(rest.copied().all(|b| b == 0xAA), "{way}: nothing else written");
                }
            }
        }
        let mut f = vec![0f64; 1000];
        let g: Vec<f64> = (0..1000).map(|i| i as f64 * 0.5).collect();
        copy_around_cache(&mut f[1..], &g);
        assert_eq!(&f[1..], &g[..999]);
    }
}
