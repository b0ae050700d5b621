//! Length-prefixed frames and the little encoder/decoder of bootstrap
//! messages. Every length is checked against a limit before anything is
//! allocated, and every decoder rejects malformed input with an error.

use crate::error::{Error, Result};
use std::io::{Read, Write};

/// The largest frame accepted (a peer table of thousands of ranks fits).
pub const MAX_FRAME: usize = 16 << 20;

/// Writes one frame: a little-endian u32 length, then the bytes.
pub fn write_frame(w: &mut impl Write, bytes: &[u8]) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| Error::transport("frame too large"))?;
    w.write_all(&len.to_le_bytes()).and_then(|()| w.write_all(bytes)).and_then(|()| w.flush()).map_err(io)
}

/// Reads one frame of at most `max` bytes.
pub fn read_frame(r: &mut impl Read, max: usize) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(io)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(Error::transport(format!("frame of {len} bytes exceeds the limit of {max}")));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

/// An I/O error of the bootstrap, in words: a read timeout says so,
/// instead of "Resource temporarily unavailable (os error 11)".
pub(crate) fn io(e: std::io::Error) -> Error {
    use std::io::ErrorKind::{TimedOut, UnexpectedEof, WouldBlock};
    match e.kind() {
        WouldBlock | TimedOut => Error::transport("bootstrap: the other side sent nothing in the time allowed"),
        UnexpectedEof => Error::transport("bootstrap: the other side closed the connection"),
        _ => Error::transport(format!("bootstrap i/o: {e}")),
    }
}

/// Appends fields to a message.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// A u64, little-endian.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A string: u32 length then UTF-8 bytes.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
}

/// Reads fields from a message, failing on truncation or garbage.
pub struct Dec<'a>(pub &'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(Error::transport("truncated bootstrap message"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    /// A u64.
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A u64 that must fit `limit` (a count or index), as usize.
    pub fn bounded(&mut self, limit: usize) -> Result<usize> {
        let v = self.u64()?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= limit)
            .ok_or_else(|| Error::transport(format!("value {v} out of range")))
    }
    /// A string of at most 4096 bytes.
    pub fn str(&mut self) -> Result<String> {
        let n = self.bounded(4096)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| Error::transport("string is not UTF-8"))
    }
    /// Fails unless everything was read.
    pub fn end(&self) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::transport("trailing bytes in bootstrap message"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_fields_round_trip_and_reject_garbage() {
        let mut buf = Vec::new();
        let mut e = Enc::default();
        e.u64(7).str("host-a");
        write_frame(&mut buf, &e.0).expect("write");
        let f = read_frame(&mut buf.as_slice(), 1024).expect("read");
        let mut d = Dec(&f);
        assert_eq!(d.u64().expect("u64"), 7);
        assert_eq!(d.str().expect("str"), "host-a");
        d.end().expect("end");
        // a huge length is refused before allocating
        let huge = [0xff, 0xff, 0xff, 0x7f];
        assert!(read_frame(&mut huge.as_slice(), MAX_FRAME).is_err());
        // truncation and trailing bytes
        assert!(Dec(&f[..5]).u64().is_err());
        assert!(Dec(&[1, 0, 0, 0, 0, 0, 0, 0, 0]).end().is_err());
        let mut long = Enc::default();
        long.u64(1 << 40);
        assert!(Dec(&long.0).str().is_err());
    }
}
