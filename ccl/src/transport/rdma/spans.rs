//! The caller's memory registered with the device for as long as the
//! caller says ([`Transport::register`](crate::transport::Transport::register),
//! NCCL's `ncclCommRegister`), so that messages lent from it are written
//! straight from there rather than copied into a slot first.
//!
//! Registration is not cached behind the caller's back: memory freed and
//! mapped again at the same address would keep the old registration's
//! pages, and a write would send stale data. A span lives exactly as long
//! as the caller's [`RegisteredBuffer`](crate::comm::RegisteredBuffer),
//! which borrows the memory, so the memory cannot go first.

use super::verbs::{Device, Mr};
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The spans registered now.
#[derive(Default)]
pub(super) struct Spans {
    list: RwLock<Vec<(u64, Mr)>>,
    next: AtomicU64,
}

impl Spans {
    /// The registration holding all `len` bytes at `p`, if one does.
    pub(super) fn find(&self, p: *const u8, len: usize) -> Option<Mr> {
        let (lo, hi) = (p as usize, (p as usize).checked_add(len)?);
        let list = self.list.read().ok()?;
        list.iter().map(|&(_, mr)| mr).find(|mr| mr.addr <= lo && hi <= mr.addr + mr.len)
    }
}

/// One span, registered until dropped.
pub(super) struct Span {
    spans: Arc<Spans>,
    dev: Arc<dyn Device>,
    id: u64,
    mr: Mr,
}

impl Span {
    /// Registers the `len` bytes at `p` with `dev` and lists them in `spans`.
    ///
    /// # Safety
    ///
    /// The memory must stay valid until the span is dropped.
    pub(super) unsafe fn new(spans: &Arc<Spans>, dev: &Arc<dyn Device>, p: *mut u8, len: usize) -> Result<Self> {
        // SAFETY: valid until the span drops, which deregisters it first (the caller's contract).
        let mr = unsafe { dev.register(p, len) }?;
        let id = spans.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = spans.list.write() {
            l.push((id, mr));
        }
        Ok(Span { spans: Arc::clone(spans), dev: Arc::clone(dev), id, mr })
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Ok(mut l) = self.spans.list.write() {
            l.retain(|&(id, _)| id != self.id);
        }
        self.dev.deregister(&self.mr);
    }
}
