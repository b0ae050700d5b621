//! Sends and receives that progress together and complete together
//! (NCCL's `ncclGroupStart`/`ncclGroupEnd`, MPI's `MPI_Isend`/`MPI_Irecv`
//! then `MPI_Waitall`), collectives among them, and `sendrecv`
//! (`MPI_Sendrecv`).
//!
//! A group's calls are queued at once when its closure returns, each as
//! the call it is: a send and a receive use connections of their own, so
//! the engine moves every one of them as its peer moves, whatever the
//! order they were posted in, and a halo exchange with any number of
//! neighbours cannot deadlock; collectives, numbered in the order posted
//! (the same on every rank, as NCCL requires), run beside them. The group
//! returns once all are done, or with the first failure once none is
//! left in flight.

use super::buffer::{Buffer, BufferMut, Place};
use super::group::Group;
use super::typed::exact;
use super::Communicator;
use crate::algo::Coll;
use crate::error::{Error, ErrorKind, Result};
use crate::op::{NoOp, ReduceOp};
use crate::Reduce;
use std::marker::PhantomData;

/// The sends, receives and collectives of one group, posted in
/// [`Communicator::grouped`]'s closure; their buffers stay borrowed until
/// the group is done.
pub struct P2pGroup<'b, T> {
    group: Group,
    ops: Vec<Posted<'b, T>>,
    _buffers: PhantomData<&'b mut [T]>,
}

/// A call posted in a group: a send or receive (kind, buffer, count,
/// peer), or a collective, which queues itself and returns its id.
enum Posted<'b, T> {
    P2p(Coll, Place, usize, usize),
    Collective(QueueItself<'b, T>),
}

/// A collective of a group, which queues itself: its id.
type QueueItself<'b, T> = Box<dyn FnOnce(&Communicator<T>) -> Result<u64> + 'b>;

/// A collective's kind, count and root, and its buffers (input, output).
type Shape = (Coll, usize, usize, (Option<Place>, Option<Place>));

impl<'b, T: Reduce> P2pGroup<'b, T> {
    fn check(&self, peer: usize) -> Result<()> {
        self.group.check_root("peer", peer)?;
        if peer == self.group.rank() {
            return Err(Error::invalid("send and recv need another rank as peer"));
        }
        Ok(())
    }

    /// Sends `buf` to `peer`, which receives as many elements (in a group
    /// or not). Two sends to one peer arrive in the order posted.
    pub fn send<B: Buffer<T> + ?Sized>(&mut self, buf: &'b B, peer: usize) -> Result<()> {
        self.check(peer)?;
        self.ops.push(Posted::P2p(Coll::Send, buf.place(), buf.elems(), peer));
        Ok(())
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<B: BufferMut<T> + ?Sized>(&mut self, buf: &'b mut B, peer: usize) -> Result<()> {
        self.check(peer)?;
        self.ops.push(Posted::P2p(Coll::Recv, buf.place_mut(), buf.elems(), peer));
        Ok(())
    }

    /// Posts a collective of `shape` with operator `O`.
    fn collective<O: ReduceOp<T>>(&mut self, shape: Shape) {
        self.ops.push(Posted::Collective(Box::new(move |c: &Communicator<T>| c.queue::<O>(shape))));
    }

    /// Reduces `buf` over all ranks in place, as
    /// [`Communicator::all_reduce`] does, beside the group's other calls.
    /// Every rank's group posts the same collectives in the same order.
    pub fn all_reduce<B: BufferMut<T> + ?Sized, O: ReduceOp<T>>(&mut self, buf: &'b mut B, _op: O) -> Result<()> {
        let n = buf.elems();
        self.collective::<O>((Coll::AllReduce, n, 0, (None, Some(buf.place_mut()))));
        Ok(())
    }

    /// [`Communicator::broadcast`] of `root`'s `buf`, in place, in the group.
    pub fn broadcast<B: BufferMut<T> + ?Sized>(&mut self, buf: &'b mut B, root: usize) -> Result<()> {
        self.group.check_root("root", root)?;
        let n = buf.elems();
        self.collective::<NoOp>((Coll::Broadcast, n, root, (None, Some(buf.place_mut()))));
        Ok(())
    }

    /// [`Communicator::all_gather`] in the group.
    pub fn all_gather<S, R>(&mut self, send: &'b S, recv: &'b mut R) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let n = send.elems();
        exact("recv buffer", n.saturating_mul(self.group.size()), recv.elems())?;
        self.collective::<NoOp>((Coll::AllGather, n, 0, (Some(send.place()), Some(recv.place_mut()))));
        Ok(())
    }

    /// [`Communicator::reduce_scatter`] in the group.
    pub fn reduce_scatter<S, R, O>(&mut self, send: &'b S, recv: &'b mut R, _op: O) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let n = recv.elems();
        exact("send buffer", n.saturating_mul(self.group.size()), send.elems())?;
        self.collective::<O>((Coll::ReduceScatter, n, 0, (Some(send.place()), Some(recv.place_mut()))));
        Ok(())
    }
}

/// Takes calls `ids` out of the engine if they are still queued when it
/// drops (a panic while waiting): their buffers are about to go.
struct Unlist<'g> {
    group: &'g Group,
    ids: Vec<u64>,
}

impl Drop for Unlist<'_> {
    fn drop(&mut self) {
        if !self.ids.is_empty() {
            let ids = std::mem::take(&mut self.ids);
            let _ = self.group.with_engine(|e| {
                e.abandon(&ids);
                Ok(())
            });
        }
    }
}

impl<T: Reduce> Communicator<T> {
    /// Runs the sends and receives `post` posts as one group: they
    /// progress together, in any order the ranks post them, and the call
    /// returns once every one is done. A receive that no rank sends ends
    /// the group by the deadline, naming the peer it waits on; a bad peer
    /// or buffer is an error before anything moves.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// // a ring halo: each rank sends to both neighbours and receives from both
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let (r, n) = (world.rank(), world.size());
    ///     let (left, right) = ((r + n - 1) % n, (r + 1) % n);
    ///     let mine = [r as f64; 4];
    ///     let (mut from_left, mut from_right) = ([0.0; 4], [0.0; 4]);
    ///     world.typed::<f64>().grouped(|g| {
    ///         g.recv(&mut from_left, left)?;
    ///         g.send(&mine, right)?;
    ///         g.send(&mine, left)?;
    ///         g.recv(&mut from_right, right)
    ///     })?;
    ///     assert_eq!((from_left[0], from_right[0]), (left as f64, right as f64));
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn grouped<'b, R>(&self, post: impl FnOnce(&mut P2pGroup<'b, T>) -> Result<R>) -> Result<R> {
        let mut g = P2pGroup { group: self.group().clone(), ops: Vec::new(), _buffers: PhantomData };
        let out = post(&mut g)?;
        self.run_group(g.ops)?;
        Ok(out)
    }

    /// Sends `send` to `dest` while receiving `recv` from `source` (which
    /// may be the same rank): a group of the two.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let other = 1 - world.rank();
    ///     let mut got = [0u32; 2];
    ///     world.typed::<u32>().sendrecv(&[world.rank() as u32; 2], other, &mut got, other)?;
    ///     assert_eq!(got, [other as u32; 2]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn sendrecv<S, R>(&self, send: &S, dest: usize, recv: &mut R, source: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        self.grouped(|g| {
            g.send(send, dest)?;
            g.recv(recv, source)
        })
    }

    /// Numbers, checks and queues a collective of a group: its id.
    fn queue<O: ReduceOp<T>>(&self, (coll, count, root, (input, output)): Shape) -> Result<u64> {
        let group = self.group();
        let seq = group.next_seq(coll);
        let ctx = |e: Error| e.in_call(coll.name(), seq).at_rank(self.rank());
        let in_place = input.is_none();
        let (i, o, device) = group.resolve(input, output).map_err(ctx)?;
        if device.is_some() {
            return Err(ctx(Error::invalid("a group's buffers must be host memory")));
        }
        let call = self.call(coll, count, root, i as *const T, o as *mut T, in_place);
        group.agree::<T, O>(&call, seq).map_err(ctx)?;
        // SAFETY: the buffers are borrowed for the group's 'b, beyond
        // `run_group`, which returns only once every queued call has
        // finished or failed (or, unwinding, has taken them out of the queue).
        unsafe { group.submit::<T, O>(call, seq, Box::new(|| {})) }.map_err(ctx)
    }

    /// Queues every call of a group, then waits for all of them.
    fn run_group(&self, ops: Vec<Posted<'_, T>>) -> Result<()> {
        let group = self.group();
        let rank = self.rank();
        // every send's and receive's buffer checked before anything is queued
        let mut calls = Vec::with_capacity(ops.len());
        for op in ops {
            let (coll, place, count, peer) = match op {
                Posted::P2p(coll, place, count, peer) => (coll, place, count, peer),
                Posted::Collective(queue) => {
                    calls.push(Queued::Collective(queue));
                    continue;
                }
            };
            let seq = group.next_seq(coll);
            let ctx = |e: Error| e.in_call(coll.name(), seq).at_rank(rank).with_peer(peer);
            let (input, output) = if coll == Coll::Send { (Some(place), None) } else { (None, Some(place)) };
            let (i, o, device) = group.resolve(input, output).map_err(ctx)?;
            if device.is_some() {
                // one stream runs a rank's device calls in order: a send
                // waiting for its peer's receive would hold up this rank's
                let why = "a group's buffers must be host memory (device sends and receives: send and recv)";
                return Err(ctx(Error::invalid(why)));
            }
            calls.push(Queued::P2p(self.call(coll, count, peer, i as *const T, o as *mut T, false), seq, peer));
        }
        let mut queued = Unlist { group, ids: Vec::with_capacity(calls.len()) };
        let mut first: Option<Error> = None;
        for q in calls {
            let id = match q {
                Queued::Collective(queue) => queue(self),
                Queued::P2p(call, seq, peer) => {
                    let coll = call.coll;
                    // SAFETY: the buffers are borrowed for 'b, beyond this
                    // call, which returns only once every queued call has
                    // finished or failed (or, unwinding, has taken them
                    // out of the queue).
                    unsafe { group.submit::<T, NoOp>(call, seq, Box::new(|| {})) }
                        .map_err(|e| e.in_call(coll.name(), seq).at_rank(rank).with_peer(peer))
                }
            };
            match id {
                Ok(id) => queued.ids.push(id),
                Err(e) => {
                    first = Some(e);
                    break;
                }
            }
        }
        while let Some(&id) = queued.ids.first() {
            let r = group.with_engine(|e| Ok(e.wait(id)));
            queued.ids.remove(0);
            // the failure that broke the others is the one to report
            if let Err(e) = r.and_then(|r| r) {
                let cause = !matches!(e.kind(), ErrorKind::Broken(_));
                if first.is_none() || cause && first.as_ref().is_some_and(|f| matches!(f.kind(), ErrorKind::Broken(_)))
                {
                    first = Some(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// A group's call ready to queue: a send or receive resolved (call,
/// number, peer), or a collective that queues itself.
enum Queued<'b, T> {
    P2p(crate::plan::Call<'static, T>, u64, usize),
    Collective(QueueItself<'b, T>),
}
