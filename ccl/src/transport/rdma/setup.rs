//! How the two ends of an RDMA connection meet: over a pair of TCP
//! connections of their own (authenticated by the job's secret, as every
//! TCP connection is), each end tells the other its queue pair and where
//! it may write (address, rkey, slots). The sender speaks first; the
//! receiver connects its queue pair, then answers, so no write reaches a
//! queue pair not yet ready. The pair stays open after: a peer that dies
//! closes it, which the waiting end reads as its loss.

use super::verbs::{QpInfo, Remote};
use crate::error::{Error, Result};
use crate::transport::tcp::{Tcp, TcpRecv, TcpSend};
use crate::transport::{ConnKey, Geometry, RecvConn, RecvVerbs, SendConn, SendVerbs, Transport};
use std::time::{Duration, Instant};

/// The channel bits that mark a connection's setup pair: the sender's
/// way, and the way back (a rank that both sends to and receives from a
/// peer on one channel has two pairs, told apart by the bits).
const SETUP: u32 = 1 << 31;
const BACK: u32 = 1 << 30;
const MAGIC: &[u8; 8] = b"ccl-rdma";
/// Queue pairs a connection may have.
pub(super) const MAX_QPS: usize = 16;
/// Bytes of a hello of `k` queue pairs.
const fn hello_bytes(k: usize) -> usize {
    8 + 1 + k * QpInfo::BYTES + 8 + 4 + 4 + 4
}
/// How often a waiting end looks at the pair for its peer's loss.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// What one end tells the other.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Hello {
    /// Its queue pairs (1 ..= `MAX_QPS`).
    pub qps: Vec<QpInfo>,
    /// Where the other end writes: the receiver's slots, or the sender's
    /// credit word.
    pub at: Remote,
    pub nslots: u32,
    /// Bytes from one slot to the next.
    pub stride: u32,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(hello_bytes(self.qps.len()));
        b.extend_from_slice(MAGIC);
        b.push(self.qps.len() as u8);
        self.qps.iter().for_each(|q| q.encode(&mut b));
        b.extend_from_slice(&self.at.addr.to_le_bytes());
        b.extend_from_slice(&self.at.rkey.to_le_bytes());
        b.extend_from_slice(&self.nslots.to_le_bytes());
        b.extend_from_slice(&self.stride.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let k = usize::from(*b.get(8)?);
        if !(1..=MAX_QPS).contains(&k) || b.len() != hello_bytes(k) || &b[..8] != MAGIC {
            return None;
        }
        let q = 9 + k * QpInfo::BYTES;
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        Some(Hello {
            qps: b[9..q].chunks(QpInfo::BYTES).map(QpInfo::decode).collect::<Option<Vec<_>>>()?,
            at: Remote { addr: u64::from_le_bytes(b[q..q + 8].try_into().ok()?), rkey: word(q + 8) },
            nslots: word(q + 12),
            stride: word(q + 16),
        })
    }
}

/// An end's TCP pair to its peer.
pub(super) struct Setup {
    tx: TcpSend,
    rx: TcpRecv,
    /// Our hello, until it is sent.
    unsent: Option<Vec<u8>>,
    checked: Instant,
}

impl Setup {
    /// The pair of connection `key` (this end is `key.from` when
    /// `sending`), over `tcp`.
    pub(super) fn open(tcp: &Tcp, key: ConnKey, sending: bool) -> Result<Self> {
        let ring = Geometry { nslots: 2, slot_bytes: hello_bytes(MAX_QPS).next_multiple_of(64) };
        let out = ConnKey { channel: key.channel | SETUP, ..key };
        let back = ConnKey { from: key.to, to: key.from, channel: key.channel | SETUP | BACK, ..key };
        let (tx, rx) = if sending {
            (tcp.connect_send(out, ring)?, tcp.connect_recv(back, ring)?)
        } else {
            (tcp.connect_send(back, ring)?, tcp.connect_recv(out, ring)?)
        };
        let (SendConn::Tcp(tx), RecvConn::Tcp(rx)) = (tx, rx) else {
            return Err(Error::internal("rdma: tcp made connections of another transport"));
        };
        Ok(Setup { tx, rx, unsent: None, checked: Instant::now() })
    }

    /// Sends `h` (as soon as the connection takes it).
    pub(super) fn say(&mut self, h: &Hello) -> Result<()> {
        self.unsent = Some(h.encode());
        self.push()
    }

    fn push(&mut self) -> Result<()> {
        if let Some(b) = &self.unsent {
            if let Some(p) = self.tx.reserve(b.len(), false)? {
                // SAFETY: a reserved slot of at least a hello's bytes.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, b.len()) };
                self.tx.post(b.len(), &[0; 4]);
                self.unsent = None;
            }
        }
        self.tx.flush()
    }

    /// The peer's hello, once it has come.
    pub(super) fn heard(&mut self) -> Result<Option<Hello>> {
        self.push()?;
        let Some((p, len, _)) = self.rx.peek()? else { return Ok(None) };
        // SAFETY: a peeked message of `len` bytes, ours until released.
        let b = unsafe { std::slice::from_raw_parts(p, len) };
        let h = Hello::decode(b);
        self.rx.release();
        h.map(Some).ok_or_else(|| Error::transport(format!("rdma: a setup message of {len} bytes that is no hello")))
    }

    /// Tells the peer, as this end's last word, that endpoint `lost` is
    /// gone (the reason this rank fails): its `alive` then names `lost`.
    pub(super) fn announce_lost(&mut self, lost: usize) {
        self.tx.announce_lost(lost);
    }

    /// The peer's hello, once it has come, if its slots are cut as this
    /// end's (`nslots` of `stride` bytes); the peer is the `whom` end.
    pub(super) fn heard_cut(&mut self, nslots: usize, stride: usize, whom: &str) -> Result<Option<Hello>> {
        let Some(h) = self.heard()? else { return Ok(None) };
        if h.nslots as usize != nslots || h.stride as usize != stride {
            let why = format!("rdma: the {whom} cut its slots {}x{} B, this end {nslots}x{stride} B", h.nslots, h.stride);
            return Err(Error::transport(why));
        }
        Ok(Some(h))
    }

    /// `Err` once the peer is gone (its end of the pair closed); looked at
    /// no more often than every `CHECK_EVERY`.
    pub(super) fn alive(&mut self) -> Result<()> {
        if self.checked.elapsed() < CHECK_EVERY {
            return Ok(());
        }
        self.checked = Instant::now();
        self.push()?;
        match self.rx.peek()? {
            None => Ok(()),
            Some(_) => Err(Error::transport("rdma: a setup message after setup")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rdma::verbs::LinkLayer;

    #[test]
    fn a_hello_round_trips_and_nothing_else_decodes() {
        let qp = QpInfo { qpn: 1, psn: 2, lid: 3, gid: [4; 16], link: LinkLayer::Infiniband, extra: [6; 40] };
        let h = Hello { qps: vec![qp; 3], at: Remote { addr: 0xdead_beef, rkey: 77 }, nslots: 8, stride: 4160 };
        let b = h.encode();
        assert_eq!(b.len(), hello_bytes(3));
        assert_eq!(Hello::decode(&b), Some(h));
        assert_eq!(Hello::decode(&b[..b.len() - 1]), None);
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(Hello::decode(&bad), None);
        let mut none = b.clone();
        none[8] = 0;
        assert_eq!(Hello::decode(&none), None, "no queue pair");
    }
}
