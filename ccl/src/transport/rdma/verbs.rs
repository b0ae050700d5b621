//! The few verbs the RDMA transport uses, as a provider offers them: a
//! device's port, memory registration, and reliable-connected queue pairs
//! that write into a peer's registered memory (with an immediate that
//! consumes one of the peer's posted receives) and report completions.
//!
//! Two providers implement them: the software one ([`super::soft`]),
//! always built, and libibverbs (feature `rdma`).

use crate::error::Result;
use std::os::fd::RawFd;

/// How a port's link is framed: InfiniBand (addressed by LID) or Ethernet
/// (RoCE, addressed by GID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    Infiniband,
    /// Ethernet (RoCE).
    Ethernet,
}

impl LinkLayer {
    /// Its name in the bootstrap's table of ranks.
    pub fn tag(self) -> &'static str {
        match self {
            LinkLayer::Infiniband => "ib",
            LinkLayer::Ethernet => "eth",
        }
    }

    /// The link layer `tag` names, if any.
    pub fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "ib" => Some(LinkLayer::Infiniband),
            "eth" => Some(LinkLayer::Ethernet),
            _ => None,
        }
    }
}

/// What a queue pair's peer needs to connect to it, and to tell which
/// queue pair it reached: sent over the authenticated bootstrap, never in
/// the clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// The port's LID (InfiniBand).
    pub lid: u16,
    /// The port's GID (RoCE; on InfiniBand when routed).
    pub gid: [u8; 16],
    /// The port's link layer: both ends must agree.
    pub link: LinkLayer,
    /// What else the provider needs to reach the queue pair (the software
    /// provider: its address and a token the connection proves).
    pub extra: [u8; 40],
}

impl QpInfo {
    /// Bytes of [`QpInfo::encode`].
    pub const BYTES: usize = 4 + 4 + 2 + 16 + 1 + 40;

    /// Its bytes, little-endian.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.gid);
        out.push(matches!(self.link, LinkLayer::Ethernet) as u8);
        out.extend_from_slice(&self.extra);
    }

    /// The info `b` encodes, if it is one.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::BYTES || b[26] > 1 {
            return None;
        }
        Some(QpInfo {
            qpn: u32::from_le_bytes(b[0..4].try_into().ok()?),
            psn: u32::from_le_bytes(b[4..8].try_into().ok()?),
            lid: u16::from_le_bytes(b[8..10].try_into().ok()?),
            gid: b[10..26].try_into().ok()?,
            link: if b[26] == 1 { LinkLayer::Ethernet } else { LinkLayer::Infiniband },
            extra: b[27..].try_into().ok()?,
        })
    }
}

/// A registered memory region: the keys that let this process's queue
/// pairs read it (`lkey`) and a peer's write into it (`rkey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    /// First byte.
    pub addr: usize,
    /// Bytes.
    pub len: usize,
    /// The key local work requests name it by.
    pub lkey: u32,
    /// The key remote writes name it by.
    pub rkey: u32,
}

/// A piece of registered local memory a write reads.
#[derive(Clone, Copy, Debug)]
pub struct Sge {
    /// First byte.
    pub addr: usize,
    /// Bytes.
    pub len: u32,
    /// Its region's `lkey`.
    pub lkey: u32,
}

/// Where a write lands in the peer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// First byte (the peer's address).
    pub addr: u64,
    /// The peer region's `rkey`.
    pub rkey: u32,
}

/// How a work request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done.
    Success,
    /// A local buffer outside every region registered with its `lkey`.
    LocalProtection,
    /// The peer refused the write: a wrong `rkey`, or out of its region.
    RemoteAccess,
    /// The peer had no receive posted for a write with immediate.
    ReceiverNotReady,
    /// The peer did not answer in time (gone, or its link down).
    RetryExceeded,
    /// The queue pair was in error: the request never ran.
    Flushed,
    /// Another failure the provider reported (its code).
    Other(i32),
}

impl Status {
    /// What it means, for an error message.
    pub fn describe(self) -> String {
        match self {
            Status::Success => "success".into(),
            Status::LocalProtection => "local protection error (memory not registered)".into(),
            Status::RemoteAccess => "remote access error (a wrong rkey or out of the peer's region)".into(),
            Status::ReceiverNotReady => "receiver not ready (no receive posted)".into(),
            Status::RetryExceeded => "transport retry counter exceeded (the peer did not answer)".into(),
            Status::Flushed => "flushed (the queue pair is in error)".into(),
            Status::Other(c) => format!("completion status {c}"),
        }
    }
}

/// What a completion completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// A write this queue pair posted.
    Write,
    /// A receive this queue pair posted, consumed by a peer's write with
    /// immediate `imm` of `len` bytes.
    Recv {
        /// The immediate.
        imm: u32,
        /// Bytes written.
        len: u32,
    },
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: Status,
    /// What it completed (unknown, [`Done::Write`], when flushed).
    pub done: Done,
}

/// An opened device port.
pub trait Device: Send + Sync {
    /// `device:port`, for messages.
    fn name(&self) -> String;
    /// Its port's link layer.
    fn link_layer(&self) -> LinkLayer;
    /// Registers `len` bytes at `addr` for local use and remote writes.
    ///
    /// # Safety
    ///
    /// The memory must stay valid until [`deregister`](Self::deregister).
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Mr>;
    /// Ends `mr`: no write reaches it after this returns.
    fn deregister(&self, mr: &Mr);
    /// A new queue pair with room for `depth` outstanding requests each
    /// way and a completion queue of its own.
    fn queue_pair(&self, depth: usize) -> Result<Box<dyn QueuePair>>;
}

/// A reliable-connected queue pair and its completion queue.
pub trait QueuePair: Send {
    /// What the peer needs to connect to it.
    fn info(&self) -> QpInfo;
    /// Connects it to the queue pair `peer` describes (ready to send and
    /// receive).
    fn connect(&mut self, peer: &QpInfo) -> Result<()>;
    /// Posts a write of `local` (gathered in order) to `remote`, with
    /// immediate `imm` (consuming one receive the peer posted), completed
    /// with a [`Completion`] if `signaled`.
    ///
    /// # Safety
    ///
    /// Every piece of `local` must stay valid, and unchanged, until the
    /// request completes (a later signaled request's completion covers
    /// it).
    unsafe fn post_write(&mut self, wr_id: u64, local: &[Sge], remote: Remote, imm: Option<u32>, signaled: bool)
        -> Result<()>;
    /// Posts a receive, consumed by the peer's next write with immediate.
    fn post_recv(&mut self, wr_id: u64) -> Result<()>;
    /// Appends completions that are ready to `out`, at most `max`.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<()>;
    /// The completion channel's descriptor: readable after
    /// [`arm`](Self::arm) once a completion arrives.
    fn fd(&self) -> RawFd;
    /// Asks for an event on [`fd`](Self::fd) at the next completion
    /// (clearing one already there); poll again after, to miss none.
    fn arm(&mut self) -> Result<()>;
    /// Moves it to the error state, as a fault the provider finds would
    /// (fault injection in tests).
    #[cfg(test)]
    fn fail(&mut self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_info_round_trips_and_refuses_other_bytes() {
        let i = QpInfo { qpn: 7, psn: 9, lid: 3, gid: [1; 16], link: LinkLayer::Ethernet, extra: [5; 40] };
        let mut b = Vec::new();
        i.encode(&mut b);
        assert_eq!(b.len(), QpInfo::BYTES);
        assert_eq!(QpInfo::decode(&b), Some(i));
        assert_eq!(QpInfo::decode(&b[1..]), None);
        b[26] = 7;
        assert_eq!(QpInfo::decode(&b), None);
    }
}
