//! Sends and receives that progress together and complete together
//! (NCCL's `ncclGroupStart`/`ncclGroupEnd`, MPI's `MPI_Isend`/`MPI_Irecv`
//! then `MPI_Waitall`), and `sendrecv` (`MPI_Sendrecv`).
//!
//! A group's calls are queued at once when its closure returns, each as
//! the point-to-point call it is: a send and a receive use connections of
//! their own, so the engine moves every one of them as its peer moves,
//! whatever the order they were posted in, and a halo exchange with any
//! number of neighbours cannot deadlock. The group returns once all are
//! done, or with the first failure once none is left in flight.

use super::buffer::{Buffer, BufferMut, Place};
use super::group::Group;
use super::Communicator;
use crate::algo::Coll;
use crate::error::{Error, ErrorKind, Result};
use crate::op::NoOp;
use crate::Reduce;
use std::marker::PhantomData;

/// The sends and receives of one group, posted in
/// [`Communicator::grouped`]'s closure; their buffers stay borrowed until
/// the group is done.
pub struct P2pGroup<'b, T> {
    group: Group,
    ops: Vec<(Coll, Place, usize, usize)>,
    _buffers: PhantomData<&'b mut [T]>,
}

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
        self.ops.push((Coll::Send, buf.place(), buf.elems(), peer));
        Ok(())
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<B: BufferMut<T> + ?Sized>(&mut self, buf: &'b mut B, peer: usize) -> Result<()> {
        self.check(peer)?;
        self.ops.push((Coll::Recv, buf.place_mut(), buf.elems(), peer));
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

    /// Queues every call of a group, then waits for all of them.
    fn run_group(&self, ops: Vec<(Coll, Place, usize, usize)>) -> Result<()> {
        let group = self.group();
        let rank = self.rank();
        // every buffer checked before anything is queued
        let mut calls = Vec::with_capacity(ops.len());
        for (coll, place, count, peer) in ops {
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
            calls.push((self.call(coll, count, peer, i as *const T, o as *mut T, false), seq, peer));
        }
        let mut queued = Unlist { group, ids: Vec::with_capacity(calls.len()) };
        let mut first: Option<Error> = None;
        for (call, seq, peer) in calls {
            let coll = call.coll;
            // SAFETY: the buffers are borrowed for 'b, beyond this call,
            // which returns only once every queued call has finished or
            // failed (or, unwinding, has taken them out of the queue).
            match unsafe { group.submit::<T, NoOp>(call, seq, Box::new(|| {})) } {
                Ok(id) => queued.ids.push(id),
                Err(e) => {
                    first = Some(e.in_call(coll.name(), seq).at_rank(rank).with_peer(peer));
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
