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
    /// `Err` once the job is going down (a peer failed): waits end with it.
    fn check_alive(&self) -> Result<()>;
}

/// The sending end of a connection.
pub enum SendConn {
    /// A slot FIFO in memory both sides can reach.
    Fifo(FifoSend),
}

/// The receiving end of a connection.
pub enum RecvConn {
    /// A slot FIFO in memory both sides can reach.
    Fifo(FifoRecv),
}

impl SendConn {
    /// A free slot to fill, if any.
    pub fn reserve(&mut self) -> Option<*mut u8> {
        match self {
            SendConn::Fifo(f) => f.reserve(),
        }
    }
    /// Publishes the reserved slot with `bytes` bytes in it.
    pub fn post(&mut self, bytes: usize) {
        match self {
            SendConn::Fifo(f) => f.post(bytes),
        }
    }
    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        match self {
            SendConn::Fifo(f) => f.slot_bytes(),
        }
    }
}

impl RecvConn {
    /// The oldest arrived slot and its length in bytes, if any.
    pub fn peek(&mut self) -> Option<(*const u8, usize)> {
        match self {
            RecvConn::Fifo(f) => f.peek(),
        }
    }
    /// Returns the peeked slot to the sender.
    pub fn release(&mut self) {
        match self {
            RecvConn::Fifo(f) => f.release(),
        }
    }
    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        match self {
            RecvConn::Fifo(f) => f.slot_bytes(),
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

    /// Whether every transport is still up.
    pub fn check_alive(&self) -> Result<()> {
        self.list.iter().try_for_each(|t| t.check_alive())
    }
}
