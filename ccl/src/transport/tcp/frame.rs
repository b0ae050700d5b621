//! The wire format of a data frame: a header (payload length, the call's
//! fingerprint, a checksum word), then the payload.

/// Frame header: payload length (u32), the call's fingerprint (4 × u64),
/// and a checksum word: bit 32 set when the low 32 bits hold the payload's
/// CRC32 (`CCL_CHECKSUM=1` on the sender).
pub(super) const HEADER: usize = 4 + 32 + 8;
pub(super) const HAS_CRC: u64 = 1 << 32;
/// First fingerprint word of a sender's last frame saying it is failing
/// because the endpoint in the second word is gone.
pub(super) const LOST: u64 = u64::MAX;

/// The header of a frame of `len` bytes of call `fp` with checksum word `check`.
pub(super) fn header(len: usize, fp: &[u64; 4], check: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&(len as u32).to_le_bytes());
    for (i, w) in fp.iter().chain([&check]).enumerate() {
        h[4 + 8 * i..12 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    h
}

/// A header's payload length, fingerprint and checksum word.
pub(super) fn parse_header(h: &[u8; HEADER]) -> (usize, [u64; 4], u64) {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let word = |i: usize| u64::from_le_bytes(h[4 + 8 * i..12 + 8 * i].try_into().unwrap_or([0; 8]));
    (len, [word(0), word(1), word(2), word(3)], word(4))
}

/// The checksum word of a frame carrying `data`: CRC-32 with [`HAS_CRC`]
/// where checksums are `on`, else 0.
pub(super) fn frame_check(on: bool, data: &[u8]) -> u64 {
    if on {
        HAS_CRC | u64::from(crc32fast::hash(data))
    } else {
        0
    }
}
