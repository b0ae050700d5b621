//! Handles of non-blocking calls.

use super::group::Group;
use crate::algo::Coll;
use crate::error::{Error, Result};
use crate::BitOr;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// A non-blocking call in flight. It owns the call's buffers and hands
/// them back from [`wait`](Request::wait), or as a [`Future`] when
/// awaited: a thread of the group then drives the call and wakes the task
/// when it finishes (no timer polls it). Dropping it without waiting lets
/// the call finish in the background (like `MPI_Request_free`); the
/// buffers stay with the call until then.
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
        self.finish(r)
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

impl<R> Request<R> {
    /// The finished call's buffers, or its error.
    fn finish(&mut self, r: Result<()>) -> Result<R> {
        self.id = u64::MAX;
        r?;
        self.slot.lock().ok().and_then(|mut s| s.take()).ok_or_else(|| Error::internal("finished call left no buffers"))
    }
}

impl<R> Future for Request<R> {
    type Output = Result<R>;

    /// Ready with what [`wait`](Request::wait) returns once the call has
    /// finished; until then the group's driving thread wakes the task.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let comm = world.typed::<f32>();
    ///     let (a, b) = (comm.iall_reduce(vec![1.0; 8], Sum), comm.iall_reduce(vec![2.0; 8], Sum));
    ///     // any executor: here the simplest, a thread parked until woken
    ///     let (a, b) = block_on(async { (a.await, b.await) });
    ///     assert_eq!((a?, b?), (vec![2.0; 8], vec![4.0; 8]));
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl std::task::Wake for Unpark {
    /// #         fn wake(self: std::sync::Arc<Self>) { self.0.unpark() }
    /// #     }
    /// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
    /// #         std::thread::park();
    /// #     }
    /// # }
    /// ```
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(r) = this.result.take() {
            return Poll::Ready(this.finish(r));
        }
        if this.id == u64::MAX {
            return Poll::Ready(Err(Error::internal("a request polled after it was ready")));
        }
        let id = this.id;
        let polled = this.group.with_engine(|e| {
            let r = e.test(id);
            if r.is_none() {
                e.set_waker(id, cx.waker());
            }
            Ok(r)
        });
        match polled.and_then(|r| r.map_or_else(|| this.group.drive_awaited().map(|()| None), |r| Ok(Some(r)))) {
            Ok(None) => Poll::Pending,
            Ok(Some(r)) => Poll::Ready(this.finish(r)),
            Err(e) => Poll::Ready(this.finish(Err(e))),
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
