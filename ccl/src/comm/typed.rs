//! [`Communicator<T>`]: the typed collectives.
//!
//! Blocking calls borrow their buffers for the duration of the call.
//! Non-blocking calls (`i…`) take ownership of `Vec`s and hand them back
//! from [`Request::wait`]. Counts follow NCCL: `all_gather` sends `count`
//! and receives `size × count`; `reduce_scatter` the reverse; `all_to_all`
//! sends `count` elements to each rank. Every rank must make the same calls
//! in the same order with matching counts, types, operators and roots.

use super::buffer::{Buffer, BufferMut, Place};
use super::group::Group;
use super::request::Request;
use super::shared::{self, SharedBuffer};
use crate::algo::{Blocks, Coll};
use crate::error::{Error, ErrorKind, Result};
use crate::op::{NoOp, ReduceOp};
use crate::plan::{Call, OnShared};
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

/// A blocking call's buffers: where each is (`None`: absent, or ignored
/// on this rank; in place, the input is `None` and the output is the
/// buffer), and every rank's, where all of them are shared.
pub(super) struct Bufs<'w> {
    input: Option<Place>,
    output: Option<Place>,
    in_place: bool,
    shared: Option<OnShared<'w>>,
}

impl Bufs<'_> {
    /// Buffers of a call that does not run in place (`input` to `output`), as ordinary memory.
    pub(super) fn apart(input: Option<Place>, output: Option<Place>) -> Self {
        Bufs { input, output, in_place: false, shared: None }
    }

    /// One buffer worked on in place, as ordinary memory.
    pub(super) fn alone(output: Option<Place>) -> Self {
        Bufs { input: None, output, in_place: true, shared: None }
    }
}

fn size_err(what: &'static str, expected: usize, got: usize) -> Error {
    Error::new(ErrorKind::BufferSize { what, expected, got })
}

/// `Ok` when `len` elements split evenly over `ranks`.
pub(super) fn divisible(len: usize, ranks: usize) -> Result<()> {
    if len.is_multiple_of(ranks) {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::NotDivisible { len, ranks }))
    }
}

/// `Ok` when a buffer (`what`) holds exactly `expected` elements.
pub(super) fn exact(what: &'static str, expected: usize, got: usize) -> Result<()> {
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

    /// Numbers the call, checks it, runs it on `bufs`; errors carry rank,
    /// call and number.
    pub(super) fn blocking<O: ReduceOp<T>>(
        &self,
        coll: Coll,
        check: impl FnOnce() -> Result<()>,
        (count, root): (usize, usize),
        bufs: Bufs<'_>,
    ) -> Result<()> {
        self.blocking_on::<O>(coll, check, (count, root, None), bufs)
    }

    /// [`blocking`](Self::blocking), on blocks that vary by rank where
    /// `blocks` says.
    pub(super) fn blocking_on<O: ReduceOp<T>>(
        &self,
        coll: Coll,
        check: impl FnOnce() -> Result<()>,
        (count, root, blocks): (usize, usize, Option<Arc<Blocks>>),
        Bufs { input, output, in_place, shared }: Bufs<'_>,
    ) -> Result<()> {
        let seq = self.group.next_seq(coll);
        let name = if blocks.is_some() { coll.name_varying() } else { coll.name() };
        let ctx = |e: Error| e.in_call(name, seq).at_rank(self.rank());
        check().map_err(ctx)?;
        let (i, o, device) = self.group.resolve(input, output).map_err(ctx)?;
        let call = Call {
            coll,
            count,
            root,
            input: i as *const T,
            output: o as *mut T,
            in_place,
            timeout: self.timeout,
            device,
            shared,
            blocks,
        };
        self.group.agree::<T, O>(&call, seq).map_err(ctx)?;
        // SAFETY: every caller passes places of buffers it borrows for the
        // whole of this blocking call (host slices, or device buffers whose
        // memory `resolve` checked).
        unsafe { self.group.run_numbered::<T, O>(call, seq) }.map_err(ctx)
    }

    /// Starts a non-blocking call on buffers it owns; `keep` holds them and
    /// turns them into the request's result at the end.
    pub(super) fn start<O: ReduceOp<T>, R: Send + 'static>(
        &self,
        coll: Coll,
        check: impl FnOnce() -> Result<()>,
        call: Call<'static, T>,
        keep: impl FnOnce() -> R + Send + 'static,
    ) -> Request<R> {
        let seq = self.group.next_seq(coll);
        let name = call.name();
        let ctx = |e: Error| e.in_call(name, seq).at_rank(self.rank());
        if let Err(e) = check().and_then(|()| self.group.agree::<T, O>(&call, seq)) {
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
        match unsafe { self.group.submit::<T, O>(call, seq, done) } {
            Ok(id) => Request::new(self.group.clone(), id, slot),
            Err(e) => Request::failed(self.group.clone(), ctx(e)),
        }
    }

    pub(super) fn call(
        &self,
        coll: Coll,
        count: usize,
        root: usize,
        input: *const T,
        output: *mut T,
        in_place: bool,
    ) -> Call<'static, T> {
        Call {
            coll,
            count,
            root,
            input,
            output,
            in_place,
            timeout: self.timeout,
            device: None,
            shared: None,
            blocks: None,
        }
    }

    /// Allocates `len` zeroed elements in memory that every rank of this
    /// communicator maps, when they all share one host (a collective call:
    /// every rank calls it, in the same order, with the same `len`). Calls
    /// whose buffers all come from such allocations (on every rank, each its
    /// own buffer of the same allocation) may then read and write the
    /// peers' buffers directly instead of passing the data through slots:
    /// `all_reduce` and `reduce_scatter` (in place or between two shared
    /// buffers), `all_gather` (likewise) and `broadcast` (in place). The
    /// tuner chooses that (algorithm `direct`) as it chooses any other, by
    /// the time it predicts; `CCL_ALGO` forces it or another. Other calls,
    /// and communicators spanning hosts (or `CCL_SHM_DISABLE=1`), use the
    /// buffer as ordinary memory.
    ///
    /// ```
    /// use ccl::{testing::run_local, Sum};
    ///
    /// let sums = run_local(2, |group| -> ccl::Result<Vec<f32>> {
    ///     let comm = group.typed::<f32>();
    ///     let mut grad = comm.alloc_shared(1 << 16)?; // 256 KiB on each rank
    ///     grad.fill(group.rank() as f32 + 1.0);
    ///     comm.all_reduce(&mut grad, Sum)?; // straight out of both ranks' buffers
    ///     Ok(grad[..4].to_vec())
    /// });
    /// for s in sums {
    ///     assert_eq!(s.unwrap(), vec![3.0; 4]);
    /// }
    /// ```
    pub fn alloc_shared(&self, len: usize) -> Result<SharedBuffer<T>> {
        shared::alloc::<T>(&self.group, len)
    }

    /// `buf`, registered with the RDMA devices of this communicator's
    /// group until the result drops (NCCL's `ncclCommRegister`): messages
    /// that blocking calls on it send over RDMA are written straight from
    /// it instead of through a copy into the connection's slots. Without
    /// RDMA it is `buf` as it is. Registration pins the memory, which
    /// `ulimit -l` bounds (a refusal is an error that says so).
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let comm = world.typed::<f32>();
    ///     let mut v = vec![1.0f32; 1 << 16];
    ///     let mut reg = comm.register(&mut v)?;
    ///     comm.all_reduce(&mut reg, Sum)?;
    ///     assert!(reg.iter().all(|&x| x == 2.0));
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(|r| r.is_ok()));
    /// ```
    pub fn register<'a>(&self, buf: &'a mut [T]) -> Result<super::RegisteredBuffer<'a, T>> {
        self.group.inner.registry.register(buf)
    }

    /// `buf`, worked on in place (and every rank's, where it is shared).
    pub(super) fn in_place<'w, B: BufferMut<T> + ?Sized>(&self, buf: &'w mut B) -> Bufs<'w> {
        let output = Some(buf.place_mut());
        let shared = buf.window().and_then(|w| w.on(&self.group, None));
        Bufs { input: None, output, in_place: true, shared }
    }

    /// From `send` into `recv` (and every rank's, where both are shared).
    pub(super) fn between<'w, S, R>(&self, send: &'w S, recv: &'w mut R) -> Bufs<'w>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (input, output) = (Some(send.place()), Some(recv.place_mut()));
        let shared = send.window().and_then(|i| recv.window()?.on(&self.group, Some(i)));
        Bufs { input, output, in_place: false, shared }
    }

    /// Reduces `buf` over all ranks, in place: afterwards every rank holds
    /// `op` applied element-wise to all ranks' `buf`. `buf` is host memory
    /// (a slice, `Vec` or array) or a [`DeviceBuffer`](crate::gpu::DeviceBuffer), as for
    /// every blocking collective.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let mut grad = vec![world.rank() as f32; 4];
    ///     world.typed::<f32>().all_reduce(&mut grad, Sum)?;
    ///     assert_eq!(grad, [3.0; 4]); // 0 + 1 + 2 on every rank
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn all_reduce<B: BufferMut<T> + ?Sized, O: ReduceOp<T>>(&self, buf: &mut B, _op: O) -> Result<()> {
        let n = buf.elems();
        self.blocking::<O>(Coll::AllReduce, || Ok(()), (n, 0), self.in_place(buf))
    }

    /// All-reduce from `send` into `recv` (same length).
    pub fn all_reduce_into<S, R, O>(&self, send: &S, recv: &mut R, _op: O) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let (n, rl) = (send.elems(), recv.elems());
        let check = || exact("recv buffer", n, rl);
        self.blocking::<O>(Coll::AllReduce, check, (n, 0), self.between(send, recv))
    }

    /// Reduces `buf` over all ranks into `root`'s `buf`; other ranks' `buf`
    /// is left as it was.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Max;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let mut v = [world.rank() as i32, -(world.rank() as i32)];
    ///     world.typed::<i32>().reduce(&mut v, Max, 0)?;
    ///     if world.rank() == 0 {
    ///         assert_eq!(v, [2, 0]);
    ///     }
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn reduce<B: BufferMut<T> + ?Sized, O: ReduceOp<T>>(&self, buf: &mut B, _op: O, root: usize) -> Result<()> {
        let n = buf.elems();
        let check = || self.group.check_root("root", root);
        self.blocking::<O>(Coll::Reduce, check, (n, root), self.in_place(buf))
    }

    /// Reduce from `send` into `root`'s `recv` (same length there; ignored,
    /// and may be empty, on other ranks).
    pub fn reduce_into<S, R, O>(&self, send: &S, recv: &mut R, _op: O, root: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let (n, rl) = (send.elems(), recv.elems());
        let me = self.rank();
        let check = || {
            self.group.check_root("root", root)?;
            if me == root && rl != n {
                return Err(size_err("recv buffer", n, rl));
            }
            Ok(())
        };
        let out = (me == root || rl > 0).then(|| recv.place_mut());
        self.blocking::<O>(Coll::Reduce, check, (n, root), Bufs::apart(Some(send.place()), out))
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let mut v = if world.rank() == 1 { vec![7u64, 8, 9] } else { vec![0; 3] };
    ///     world.typed::<u64>().broadcast(&mut v, 1)?;
    ///     assert_eq!(v, [7, 8, 9]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn broadcast<B: BufferMut<T> + ?Sized>(&self, buf: &mut B, root: usize) -> Result<()> {
        let n = buf.elems();
        let check = || self.group.check_root("root", root);
        self.blocking::<NoOp>(Coll::Broadcast, check, (n, root), self.in_place(buf))
    }

    /// Copies `root`'s `send` into every rank's `recv` (`send` is ignored,
    /// and may be empty, on other ranks).
    pub fn broadcast_into<S, R>(&self, send: &S, recv: &mut R, root: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (n, sl) = (recv.elems(), send.elems());
        let me = self.rank();
        let check = || {
            self.group.check_root("root", root)?;
            if me == root && sl != n {
                return Err(size_err("send buffer", n, sl));
            }
            Ok(())
        };
        let input = (me == root || sl > 0).then(|| send.place());
        self.blocking::<NoOp>(Coll::Broadcast, check, (n, root), Bufs::apart(input, Some(recv.place_mut())))
    }

    /// Gathers every rank's `send` into `recv` (`size × send.len()`), in rank order.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let mine = [world.rank() as u8; 2];
    ///     let mut all = [0u8; 6];
    ///     world.typed::<u8>().all_gather(&mine, &mut all)?;
    ///     assert_eq!(all, [0, 0, 1, 1, 2, 2]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn all_gather<S: Buffer<T> + ?Sized, R: BufferMut<T> + ?Sized>(&self, send: &S, recv: &mut R) -> Result<()> {
        let (n, rl) = (send.elems(), recv.elems());
        let want = n.saturating_mul(self.size());
        let check = || exact("recv buffer", want, rl);
        self.blocking::<NoOp>(Coll::AllGather, check, (n, 0), self.between(send, recv))
    }

    /// All-gather in place: `buf` holds `size` blocks; this rank's block
    /// (at `rank × len/size`) is its contribution.
    pub fn all_gather_in_place<B: BufferMut<T> + ?Sized>(&self, buf: &mut B) -> Result<()> {
        let (len, s) = (buf.elems(), self.size());
        let check = || divisible(len, s);
        self.blocking::<NoOp>(Coll::AllGather, check, (len / s, 0), self.in_place(buf))
    }

    /// Reduces `send` (`size × recv.len()`) over all ranks; rank `r` gets
    /// block `r` of the result in `recv`.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let send = [1.0f64, 2.0, 3.0, 4.0]; // two blocks of two
    ///     let mut mine = [0.0; 2];
    ///     world.typed::<f64>().reduce_scatter(&send, &mut mine, Sum)?;
    ///     let want = if world.rank() == 0 { [2.0, 4.0] } else { [6.0, 8.0] };
    ///     assert_eq!(mine, want);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn reduce_scatter<S, R, O>(&self, send: &S, recv: &mut R, _op: O) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let (n, sl) = (recv.elems(), send.elems());
        let want = n.saturating_mul(self.size());
        let check = || exact("send buffer", want, sl);
        self.blocking::<O>(Coll::ReduceScatter, check, (n, 0), self.between(send, recv))
    }

    /// Reduce-scatter in place: `buf` holds `size` blocks; afterwards this
    /// rank's block (at `rank × len/size`) holds its block of the result.
    /// Other blocks are left as they were.
    pub fn reduce_scatter_in_place<B: BufferMut<T> + ?Sized, O: ReduceOp<T>>(&self, buf: &mut B, _op: O) -> Result<()> {
        let (len, s) = (buf.elems(), self.size());
        let check = || divisible(len, s);
        self.blocking::<O>(Coll::ReduceScatter, check, (len / s, 0), self.in_place(buf))
    }

    /// Sends block `d` of `send` to rank `d` and receives rank `s`'s block
    /// for us into block `s` of `recv` (both `size × count`).
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let r = world.rank() as u32;
    ///     let send = [10 * r, 10 * r + 1]; // block d goes to rank d
    ///     let mut recv = [0u32; 2];
    ///     world.typed::<u32>().all_to_all(&send, &mut recv)?;
    ///     assert_eq!(recv, [r, 10 + r]); // block s came from rank s
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn all_to_all<S: Buffer<T> + ?Sized, R: BufferMut<T> + ?Sized>(&self, send: &S, recv: &mut R) -> Result<()> {
        let (len, rl, s) = (send.elems(), recv.elems(), self.size());
        let check = || exact("recv buffer", len, rl).and_then(|()| divisible(len, s));
        self.blocking::<NoOp>(Coll::AllToAll, check, (len / s, 0), self.between(send, recv))
    }

    /// All-to-all in place on `buf` (`size × count`).
    pub fn all_to_all_in_place<B: BufferMut<T> + ?Sized>(&self, buf: &mut B) -> Result<()> {
        let (len, s) = (buf.elems(), self.size());
        let check = || divisible(len, s);
        self.blocking::<NoOp>(Coll::AllToAll, check, (len / s, 0), self.in_place(buf))
    }

    /// Blocks until every rank has entered the barrier (within this
    /// communicator's deadline).
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(2, |world| world.typed::<u8>().barrier());
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.group.barrier_within(self.timeout)
    }

    /// Non-blocking [`all_reduce`](Self::all_reduce); the request returns `buf`.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let req = world.typed::<f32>().iall_reduce(vec![1.0; 8], Sum);
    ///     // ... other work while the call progresses ...
    ///     assert_eq!(req.wait()?, vec![2.0; 8]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
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
}

impl Group {
    /// The typed communicator for elements of `T` on this group.
    pub fn typed<T: Reduce>(&self) -> Communicator<T> {
        Communicator::new(self.clone())
    }
}
