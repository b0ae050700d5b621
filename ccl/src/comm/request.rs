//! Handles of non-blocking calls.

use super::group::Group;
use crate::algo::Coll;
use crate::error::{Error, Result};
use crate::BitOr;
use std::sync::{Arc, Mutex};

/// A non-blocking call in flight. It owns the call's buffers and hands
/// them back from [`wait`](Request::wait). Dropping it without waiting lets
/// the call finish in the background (like `MPI_Request_free`).
#[must_use = "a request does nothing unless waited on or tested; its buffers come back from wait()"]
pub struct Request<R> {
    group: Group,
    id: u64,
    slot: Arc<Mutex<Option<R>>>,
    result: Option<Result<()>>,
}

impl<R> Request<R> {
    pub(crate) fn new(group: Group, id: u64, slot: Arc<Mutex<Option<R>>>) -> Self {
        Request { group, id, slot, result: None }
    }

    /// A request that failed before it started.
    pub(crate) fn failed(group: Group, err: Error) -> Self {
        Request { group, id: u64::MAX, slot: Arc::new(Mutex::new(None)), result: Some(Err(err)) }
    }

    /// Blocks until the call finishes; its buffers, or its error.
    pub fn wait(mut self) -> Result<R> {
        let r = match self.result.take() {
            Some(r) => r,
            None => self.group.with_engine(|e| Ok(e.wait(self.id)))?,
        };
        self.id = u64::MAX;
        r?;
        self.slot.lock().ok().and_then(|mut s| s.take()).ok_or_else(|| Error::internal("finished call left no buffers"))
    }

    /// Advances communication once; `Ok(true)` when the call has finished
    /// (then [`wait`](Self::wait) returns at once), `Err` if it failed.
    pub fn test(&mut self) -> Result<bool> {
        if self.result.is_none() {
            self.result = self.group.with_engine(|e| Ok(e.test(self.id)))?;
        }
        match &self.result {
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(())) => Ok(true),
            None => Ok(false),
        }
    }
}

impl<R> Drop for Request<R> {
    fn drop(&mut self) {
        if self.id != u64::MAX && self.result.is_none() {
            let _ = self.group.with_engine(|e| {
                e.detach(self.id);
                Ok(())
            });
        }
    }
}

impl Group {
    /// A barrier that completes in the background.
    pub fn ibarrier(&self) -> Request<()> {
        let seq = self.next_seq(Coll::Barrier);
        let call = Self::barrier_call(None);
        let slot = Arc::new(Mutex::new(None));
        let s2 = Arc::clone(&slot);
        let done: Box<dyn FnOnce() + Send> = Box::new(move || {
            if let Ok(mut s) = s2.lock() {
                *s = Some(());
            }
        });
        // SAFETY: no user buffer.
        match unsafe { self.submit::<u8, BitOr>(call, seq, done) } {
            Ok(id) => Request::new(self.clone(), id, slot),
            Err(e) => Request::failed(self.clone(), e.in_call("barrier", seq).at_rank(self.rank())),
        }
    }
}
