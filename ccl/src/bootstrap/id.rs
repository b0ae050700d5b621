//! [`UniqueId`]: where the rendezvous listens and the job's secret.
//!
//! Text form `ccl1@<host:port>#<32 hex digits>`, passed to ranks in the
//! environment (`CCL_UNIQUE_ID`), never on a command line. Its `Display`
//! hides the secret, so logging an id does not leak it.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::fmt;
use std::net::SocketAddr;

/// Rendezvous address plus a random 128-bit secret.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    /// Where the rendezvous listens.
    pub addr: SocketAddr,
    secret: [u8; 16],
}

impl UniqueId {
    /// A fresh id for a rendezvous at `addr`, with a secret from the OS's
    /// random source.
    pub fn new(addr: SocketAddr) -> Self {
        UniqueId { addr, secret: rand::random() }
    }

    /// The secret every connection must prove it knows.
    pub fn secret(&self) -> &[u8; 16] {
        &self.secret
    }

    /// A short name for this job, derived from the secret (not revealing
    /// it): used to name shared-memory files.
    pub fn job_tag(&self) -> String {
        let d = Sha256::digest([b"ccl-job".as_slice(), &self.secret].concat());
        d[..6].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// How this job names and seals its files in `/dev/shm`.
    pub fn files(&self) -> crate::transport::shm_file::JobFiles {
        crate::transport::shm_file::JobFiles::new(self.job_tag(), &self.secret)
    }

    /// The full text form, secret included: for the environment only.
    pub fn to_env_string(&self) -> String {
        let hex: String = self.secret.iter().map(|b| format!("{b:02x}")).collect();
        format!("ccl1@{}#{hex}", self.addr)
    }

    /// Parses the text form; malformed input is an error, never a panic.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid(format!("CCL_UNIQUE_ID: {why} (expected ccl1@HOST:PORT#32-HEX-DIGITS)"));
        let rest = s.trim().strip_prefix("ccl1@").ok_or_else(|| bad("missing ccl1@ prefix"))?;
        let (addr, hex) = rest.rsplit_once('#').ok_or_else(|| bad("missing #secret"))?;
        let addr: SocketAddr = addr.parse().map_err(|_| bad("bad address"))?;
        let secret = parse_secret(hex).ok_or_else(|| bad("secret is not 32 hex digits"))?;
        Ok(UniqueId { addr, secret })
    }

    /// An id from a rendezvous address and a secret given as 32 hex digits
    /// (`CCL_ROOT` and `CCL_SECRET`).
    pub fn from_parts(addr: SocketAddr, secret_hex: &str) -> Result<Self> {
        let secret = parse_secret(secret_hex.trim())
            .ok_or_else(|| Error::invalid("CCL_SECRET is not 32 hex digits (make one with `openssl rand -hex 16`)"))?;
        Ok(UniqueId { addr, secret })
    }
}

fn parse_secret(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.is_ascii() {
        return None;
    }
    let mut secret = [0u8; 16];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(secret)
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({}, secret hidden)", self.addr)
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ccl1@{}#<secret>", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let id = UniqueId::new("127.0.0.1:4242".parse().expect("addr"));
        let back = UniqueId::parse(&id.to_env_string()).expect("parse");
        assert_eq!(back, id);
        assert!(!format!("{id} {id:?}").contains(&id.to_env_string()[20..]));
        for bad in [
            "",
            "ccl1@",
            "ccl1@127.0.0.1:1#00",
            "ccl1@nohost#00112233445566778899aabbccddeeff",
            "x@1.2.3.4:5#00112233445566778899aabbccddeeff",
            "ccl1@1.2.3.4:5#zz112233445566778899aabbccddeeff",
            "ccl1@1.2.3.4:5#é0112233445566778899aabbccddeef",
        ] {
            assert!(UniqueId::parse(bad).is_err(), "{bad}");
        }
        let v6 = UniqueId::new("[::1]:80".parse().expect("v6"));
        assert_eq!(UniqueId::parse(&v6.to_env_string()).expect("v6 parse").addr, v6.addr);
    }
}
