//! Transports move slots between ranks.
//!
//! A transport connects one direction to one peer and hands back a
//! [`SendConn`] or [`RecvConn`]; after setup the data path is a `match` on
//! these enums, never a trait object. Transports are tried in order, first
//! match wins ([`Registry`]); a pair no transport can connect is an error
//! naming both ranks and every transport that declined.
//!
//! This issue ships the in-process transport ([`local`]) that runs ranks as
//! threads. Shared memory and TCP plug in as further variants: the
//! executor and the algorithms do not change.

pub mod doorbell;
pub mod fifo;
pub mod local;
pub mod shm;

use crate::error::{Error, Result};
use doorbell::Doorbell;
use fifo::{FifoRecv, FifoSend};
use std::sync::Arc;

/// Identifies one direction of one connection: communicator, endpoints
/// (world ranks), channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// The communicator's id.
    pub comm: u64,
    /// Sending endpoint.
    pub from: usize,
    /// Receiving endpoint.
    pub to: usize,
    /// Channel.
    pub channel: u32,
}

/// A way to reach peers.
pub trait Transport: Send + Sync {
    /// Short name for messages (`"local"`).
    fn name(&self) -> &'static str;
    /// Whether this transport connects endpoint `from` to endpoint `to`.
    fn can_connect(&self, from: usize, to: usize) -> bool;
    /// The sending end of `key` (this endpoint is `key.from`).
    fn connect_send(&self, key: ConnKey) -> Result<SendConn>;
    /// The receiving end of `key` (this endpoint is `key.to`).
    fn connect_recv(&self, key: ConnKey) -> Result<RecvConn>;
    /// The doorbell this endpoint sleeps on; peers ring it when they post
    /// to it or free a slot of its.
    fn bell(&self) -> &Doorbell;
    /// `Err` if the job is going down or one of `peers` (endpoints this
    /// rank is stuck waiting on) is gone: waits end with it.
    fn check_alive(&self, peers: &[usize]) -> Result<()>;
}

/// The sending end of a connection.
pub enum SendConn {
    /// A slot FIFO in memory of this process.
    Fifo(FifoSend),
    /// A slot FIFO in memory shared with another process, mapped once both
    /// sides have arrived; and its slot size.
    Shm(shm::Lazy<FifoSend>, usize),
}

/// The receiving end of a connection.
pub enum RecvConn {
    /// A slot FIFO in memory of this process.
    Fifo(FifoRecv),
    /// A slot FIFO shared with another process, and its slot size.
    Shm(shm::Lazy<FifoRecv>, usize),
}

impl SendConn {
    /// A free slot to fill, if any (`None` also while still connecting).
    pub fn reserve(&mut self) -> Result<Option<*mut u8>> {
        Ok(match self {
            SendConn::Fifo(f) => f.reserve(),
            SendConn::Shm(l, _) => l.get()?.and_then(|f| f.reserve()),
        })
    }
    /// Publishes the slot [`reserve`](Self::reserve) returned, holding `bytes` bytes.
    pub fn post(&mut self, bytes: usize) {
        match self {
            SendConn::Fifo(f) => f.post(bytes),
            SendConn::Shm(l, _) => {
                if let Ok(Some(f)) = l.get() {
                    f.post(bytes)
                }
            }
        }
    }
    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        match self {
            SendConn::Fifo(f) => f.slot_bytes(),
            SendConn::Shm(_, b) => *b,
        }
    }
}

impl RecvConn {
    /// The oldest arrived slot and its length in bytes, if any.
    pub fn peek(&mut self) -> Result<Option<(*const u8, usize)>> {
        Ok(match self {
            RecvConn::Fifo(f) => f.peek(),
            RecvConn::Shm(l, _) => l.get()?.and_then(|f| f.peek()),
        })
    }
    /// Returns the slot [`peek`](Self::peek) returned to the sender.
    pub fn release(&mut self) {
        match self {
            RecvConn::Fifo(f) => f.release(),
            RecvConn::Shm(l, _) => {
                if let Ok(Some(f)) = l.get() {
                    f.release()
                }
            }
        }
    }
    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        match self {
            RecvConn::Fifo(f) => f.slot_bytes(),
            RecvConn::Shm(_, b) => *b,
        }
    }
}

/// Transports in order of preference; the first that can connect a pair does.
pub struct Registry {
    list: Vec<Arc<dyn Transport>>,
}

impl Registry {
    /// A registry trying `list` in order; the first also provides the
    /// doorbell and liveness of this endpoint.
    pub fn new(list: Vec<Arc<dyn Transport>>) -> Result<Self> {
        if list.is_empty() {
            return Err(Error::internal("no transport"));
        }
        Ok(Registry { list })
    }

    fn pick(&self, from: usize, to: usize) -> Result<&Arc<dyn Transport>> {
        self.list.iter().find(|t| t.can_connect(from, to)).ok_or_else(|| {
            let names: Vec<_> = self.list.iter().map(|t| t.name()).collect();
            Error::transport(format!("no transport connects endpoint {from} to {to} (declined: {})", names.join(", ")))
        })
    }

    /// Connects the sending end of `key`.
    pub fn connect_send(&self, key: ConnKey) -> Result<SendConn> {
        self.pick(key.from, key.to)?.connect_send(key)
    }

    /// Connects the receiving end of `key`.
    pub fn connect_recv(&self, key: ConnKey) -> Result<RecvConn> {
        self.pick(key.from, key.to)?.connect_recv(key)
    }

    /// This endpoint's doorbell.
    pub fn bell(&self) -> &Doorbell {
        self.list[0].bell()
    }

    /// Whether every transport is up and `peers` (endpoints) are alive.
    pub fn check_alive(&self, peers: &[usize]) -> Result<()> {
        self.list.iter().try_for_each(|t| t.check_alive(peers))
    }
}
