//! [`Communicator<T>`]: the typed collectives.
//!
//! Blocking calls borrow their buffers for the duration of the call.
//! Non-blocking calls (`i…`) take ownership of `Vec`s and hand them back
//! from [`Request::wait`]. Counts follow NCCL: `all_gather` sends `count`
//! and receives `size × count`; `reduce_scatter` the reverse; `all_to_all`
//! sends `count` elements to each rank. Every rank must make the same calls
//! in the same order with matching counts, types, operators and roots.

use super::group::{Call, Group};
use super::request::Request;
use crate::algo::Coll;
use crate::error::{Error, ErrorKind, Result};
use crate::op::{NoOp, ReduceOp};
use crate::Reduce;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// A communicator for elements of type `T`: a cheap typed handle on a
/// [`Group`] (see `group.typed::<T>()`).
#[derive(Clone)]
pub struct Communicator<T> {
    group: Group,
    timeout: Option<std::time::Duration>,
    _t: PhantomData<fn() -> T>,
}

fn size_err(what: &'static str, expected: usize, got: usize) -> Error {
    Error::new(ErrorKind::BufferSize { what, expected, got })
}

/// `Ok` when `len` elements split evenly over `ranks`.
fn divisible(len: usize, ranks: usize) -> Result<()> {
    if len.is_multiple_of(ranks) {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::NotDivisible { len, ranks }))
    }
}

/// `Ok` when a buffer (`what`) holds exactly `expected` elements.
fn exact(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(size_err(what, expected, got))
    }
}

impl<T: Reduce> Communicator<T> {
    pub(crate) fn new(group: Group) -> Self {
        Communicator { group, timeout: None, _t: PhantomData }
    }

    /// The same communicator with another deadline for its calls (instead
    /// of `CCL_TIMEOUT`): `comm.with_timeout(Duration::from_secs(5)).all_reduce(...)`.
    pub fn with_timeout(&self, timeout: std::time::Duration) -> Self {
        Communicator { group: self.group.clone(), timeout: Some(timeout), _t: PhantomData }
    }

    /// The untyped group this communicator runs on.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// Numbers the call, checks it, runs it; errors carry rank, call and number.
    fn blocking<O: ReduceOp<T>>(
        &self,
        coll: Coll,
        check: impl FnOnce() -> Result<()>,
        call: impl FnOnce() -> Call<T>,
    ) -> Result<()> {
        let seq = self.group.next_seq(coll);
        let ctx = |e: Error| e.in_call(coll.name(), seq).at_rank(self.rank());
        check().map_err(ctx)?;
        // SAFETY: every caller builds `call` from slices it borrows for the
        // whole of this blocking call.
        unsafe { self.group.run_numbered::<T, O>(call(), seq) }.map_err(ctx)
    }

    /// Starts a non-blocking call on buffers it owns; `keep` holds them and
    /// turns them into the request's result at the end.
    fn start<O: ReduceOp<T>, R: Send + 'static>(
        &self,
        coll: Coll,
        check: impl FnOnce() -> Result<()>,
        call: Call<T>,
        keep: impl FnOnce() -> R + Send + 'static,
    ) -> Request<R> {
        let seq = self.group.next_seq(coll);
        let ctx = |e: Error| e.in_call(coll.name(), seq).at_rank(self.rank());
        if let Err(e) = check() {
            return Request::failed(self.group.clone(), ctx(e));
        }
        let slot = Arc::new(Mutex::new(None));
        let s2 = Arc::clone(&slot);
        let done: Box<dyn FnOnce() + Send> = Box::new(move || {
            let r = keep();
            if let Ok(mut s) = s2.lock() {
                *s = Some(r);
            }
        });
        // SAFETY: `call` points into Vecs moved into `keep`, which the
        // pending call owns until it completes or fails; nobody else can
        // reach them meanwhile, and moving a Vec does not move its heap buffer.
        match unsafe { self.group.submit::<T, O>(call, seq, Some(done)) } {
            Ok(id) => Request::new(self.group.clone(), id, slot),
            Err(e) => Request::failed(self.group.clone(), ctx(e)),
        }
    }

    fn call(&self, coll: Coll, count: usize, root: usize, input: *const T, output: *mut T, in_place: bool) -> Call<T> {
        Call { coll, count, root, input, output, in_place, timeout: self.timeout }
    }

    /// Reduces `buf` over all ranks, in place: afterwards every rank holds
    /// `op` applied element-wise to all ranks' `buf`.
    pub fn all_reduce<O: ReduceOp<T>>(&self, buf: &mut [T], _op: O) -> Result<()> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        self.blocking::<O>(Coll::AllReduce, || Ok(()), || self.call(Coll::AllReduce, n, 0, p, p, true))
    }

    /// All-reduce from `send` into `recv` (same length).
    pub fn all_reduce_into<O: ReduceOp<T>>(&self, send: &[T], recv: &mut [T], _op: O) -> Result<()> {
        let rl = recv.len();
        let n = send.len();
        let check = || exact("recv buffer", n, rl);
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        self.blocking::<O>(Coll::AllReduce, check, || self.call(Coll::AllReduce, n, 0, i, o, false))
    }

    /// Reduces `buf` over all ranks into `root`'s `buf`; other ranks' `buf`
    /// is left as it was.
    pub fn reduce<O: ReduceOp<T>>(&self, buf: &mut [T], _op: O, root: usize) -> Result<()> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        let check = || self.group.check_root("root", root);
        self.blocking::<O>(Coll::Reduce, check, || self.call(Coll::Reduce, n, root, p, p, true))
    }

    /// Reduce from `send` into `root`'s `recv` (same length there; ignored,
    /// and may be empty, on other ranks).
    pub fn reduce_into<O: ReduceOp<T>>(&self, send: &[T], recv: &mut [T], _op: O, root: usize) -> Result<()> {
        let rl = recv.len();
        let n = send.len();
        let me = self.rank();
        let check = || {
            self.group.check_root("root", root)?;
            if me == root && rl != n {
                return Err(size_err("recv buffer", n, rl));
            }
            Ok(())
        };
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        self.blocking::<O>(Coll::Reduce, check, || self.call(Coll::Reduce, n, root, i, o, false))
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast(&self, buf: &mut [T], root: usize) -> Result<()> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        let check = || self.group.check_root("root", root);
        self.blocking::<NoOp>(Coll::Broadcast, check, || self.call(Coll::Broadcast, n, root, p, p, true))
    }

    /// Copies `root`'s `send` into every rank's `recv` (`send` is ignored,
    /// and may be empty, on other ranks).
    pub fn broadcast_into(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let rl = recv.len();
        let n = rl;
        let me = self.rank();
        let check = || {
            self.group.check_root("root", root)?;
            if me == root && send.len() != n {
                return Err(size_err("send buffer", n, send.len()));
            }
            Ok(())
        };
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        self.blocking::<NoOp>(Coll::Broadcast, check, || self.call(Coll::Broadcast, n, root, i, o, false))
    }

    /// Gathers every rank's `send` into `recv` (`size × send.len()`), in rank order.
    pub fn all_gather(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let rl = recv.len();
        let n = send.len();
        let want = n.saturating_mul(self.size());
        let check = || exact("recv buffer", want, rl);
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        self.blocking::<NoOp>(Coll::AllGather, check, || self.call(Coll::AllGather, n, 0, i, o, false))
    }

    /// All-gather in place: `buf` holds `size` blocks; this rank's block
    /// (at `rank × len/size`) is its contribution.
    pub fn all_gather_in_place(&self, buf: &mut [T]) -> Result<()> {
        let (len, s) = (buf.len(), self.size());
        let check = || divisible(len, s);
        let p = buf.as_mut_ptr();
        self.blocking::<NoOp>(Coll::AllGather, check, || self.call(Coll::AllGather, len / s, 0, p, p, true))
    }

    /// Reduces `send` (`size × recv.len()`) over all ranks; rank `r` gets
    /// block `r` of the result in `recv`.
    pub fn reduce_scatter<O: ReduceOp<T>>(&self, send: &[T], recv: &mut [T], _op: O) -> Result<()> {
        let n = recv.len();
        let want = n.saturating_mul(self.size());
        let check = || exact("send buffer", want, send.len());
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        self.blocking::<O>(Coll::ReduceScatter, check, || self.call(Coll::ReduceScatter, n, 0, i, o, false))
    }

    /// Reduce-scatter in place: `buf` holds `size` blocks; afterwards this
    /// rank's block (at `rank × len/size`) holds its block of the result.
    /// Other blocks are left as they were.
    pub fn reduce_scatter_in_place<O: ReduceOp<T>>(&self, buf: &mut [T], _op: O) -> Result<()> {
        let (len, s) = (buf.len(), self.size());
        let check = || divisible(len, s);
        let p = buf.as_mut_ptr();
        self.blocking::<O>(Coll::ReduceScatter, check, || self.call(Coll::ReduceScatter, len / s, 0, p, p, true))
    }

    /// Sends block `d` of `send` to rank `d` and receives rank `s`'s block
    /// for us into block `s` of `recv` (both `size × count`).
    pub fn all_to_all(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let rl = recv.len();
        let (len, s) = (send.len(), self.size());
        let check = || exact("recv buffer", len, rl).and_then(|()| divisible(len, s));
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        self.blocking::<NoOp>(Coll::AllToAll, check, || self.call(Coll::AllToAll, len / s, 0, i, o, false))
    }

    /// All-to-all in place on `buf` (`size × count`).
    pub fn all_to_all_in_place(&self, buf: &mut [T]) -> Result<()> {
        let (len, s) = (buf.len(), self.size());
        let check = || divisible(len, s);
        let p = buf.as_mut_ptr();
        self.blocking::<NoOp>(Coll::AllToAll, check, || self.call(Coll::AllToAll, len / s, 0, p, p, true))
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        self.group.check_root("peer", peer)?;
        if peer == self.rank() {
            return Err(Error::invalid("send and recv need another rank as peer"));
        }
        Ok(())
    }

    /// Sends `buf` to `peer`, which must `recv` as many elements. Messages
    /// between two ranks arrive in the order they were sent.
    pub fn send(&self, buf: &[T], peer: usize) -> Result<()> {
        let (n, p) = (buf.len(), buf.as_ptr());
        let check = || self.check_peer(peer);
        self.blocking::<NoOp>(Coll::Send, check, || {
            self.call(Coll::Send, n, peer, p, std::ptr::NonNull::dangling().as_ptr(), false)
        })
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        let check = || self.check_peer(peer);
        self.blocking::<NoOp>(Coll::Recv, check, || {
            self.call(Coll::Recv, n, peer, std::ptr::NonNull::dangling().as_ptr(), p, false)
        })
    }

    /// Blocks until every rank has entered the barrier (within this
    /// communicator's deadline).
    pub fn barrier(&self) -> Result<()> {
        self.group.barrier_within(self.timeout)
    }

    /// Non-blocking [`all_reduce`](Self::all_reduce); the request returns `buf`.
    pub fn iall_reduce<O: ReduceOp<T>>(&self, mut buf: Vec<T>, _op: O) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        self.start::<O, _>(Coll::AllReduce, || Ok(()), self.call(Coll::AllReduce, n, 0, p, p, true), move || buf)
    }

    /// Non-blocking [`reduce`](Self::reduce); the request returns `buf`.
    pub fn ireduce<O: ReduceOp<T>>(&self, mut buf: Vec<T>, _op: O, root: usize) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        let check = || self.group.check_root("root", root);
        self.start::<O, _>(Coll::Reduce, check, self.call(Coll::Reduce, n, root, p, p, true), move || buf)
    }

    /// Non-blocking [`broadcast`](Self::broadcast); the request returns `buf`.
    pub fn ibroadcast(&self, mut buf: Vec<T>, root: usize) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        let check = || self.group.check_root("root", root);
        self.start::<NoOp, _>(Coll::Broadcast, check, self.call(Coll::Broadcast, n, root, p, p, true), move || buf)
    }

    /// Non-blocking [`all_gather`](Self::all_gather); the request returns
    /// the gathered `size × send.len()` elements.
    pub fn iall_gather(&self, send: Vec<T>) -> Request<Vec<T>> {
        let n = send.len();
        let mut out = vec![T::zeroed(); n.saturating_mul(self.size())];
        let (i, o) = (send.as_ptr(), out.as_mut_ptr());
        let call = self.call(Coll::AllGather, n, 0, i, o, false);
        self.start::<NoOp, _>(
            Coll::AllGather,
            || Ok(()),
            call,
            move || {
                drop(send);
                out
            },
        )
    }

    /// Non-blocking [`reduce_scatter`](Self::reduce_scatter); the request
    /// returns this rank's block of the result.
    pub fn ireduce_scatter<O: ReduceOp<T>>(&self, send: Vec<T>, _op: O) -> Request<Vec<T>> {
        let (len, s) = (send.len(), self.size());
        let mut out = vec![T::zeroed(); len / s];
        let check = || divisible(len, s);
        let (i, o) = (send.as_ptr(), out.as_mut_ptr());
        let call = self.call(Coll::ReduceScatter, len / s, 0, i, o, false);
        self.start::<O, _>(Coll::ReduceScatter, check, call, move || {
            drop(send);
            out
        })
    }

    /// Non-blocking [`all_to_all_in_place`](Self::all_to_all_in_place); the request returns `buf`.
    pub fn iall_to_all(&self, mut buf: Vec<T>) -> Request<Vec<T>> {
        let (len, s) = (buf.len(), self.size());
        let check = || divisible(len, s);
        let p = buf.as_mut_ptr();
        self.start::<NoOp, _>(Coll::AllToAll, check, self.call(Coll::AllToAll, len / s, 0, p, p, true), move || buf)
    }

    /// Non-blocking [`send`](Self::send); the request returns `buf`.
    pub fn isend(&self, buf: Vec<T>, peer: usize) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_ptr());
        let check = || self.check_peer(peer);
        let call = self.call(Coll::Send, n, peer, p, std::ptr::NonNull::dangling().as_ptr(), false);
        self.start::<NoOp, _>(Coll::Send, check, call, move || buf)
    }

    /// Non-blocking [`recv`](Self::recv) into `buf`; the request returns it filled.
    pub fn irecv(&self, mut buf: Vec<T>, peer: usize) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        let check = || self.check_peer(peer);
        let call = self.call(Coll::Recv, n, peer, std::ptr::NonNull::dangling().as_ptr(), p, false);
        self.start::<NoOp, _>(Coll::Recv, check, call, move || buf)
    }
}
