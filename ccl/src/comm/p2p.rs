//! Point-to-point calls on [`Communicator<T>`]: `send` and `recv`,
//! blocking and non-blocking (MPI_Send and MPI_Recv, ncclSend and
//! ncclRecv). Several that progress together: [`grouped`](Communicator::grouped).

use super::request::Request;
use super::typed::Bufs;
use super::{Buffer, BufferMut, Communicator};
use crate::algo::Coll;
use crate::error::{Error, Result};
use crate::op::NoOp;
use crate::Reduce;

impl<T: Reduce> Communicator<T> {
    fn check_peer(&self, peer: usize) -> Result<()> {
        self.group().check_root("peer", peer)?;
        if peer == self.rank() {
            return Err(Error::invalid("send and recv need another rank as peer"));
        }
        Ok(())
    }

    /// Sends `buf` to `peer`, which must `recv` as many elements. Messages
    /// between two ranks arrive in the order they were sent.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let c = world.typed::<i16>();
    ///     if world.rank() == 0 {
    ///         c.send(&[1, 2, 3], 1)?;
    ///     } else {
    ///         let mut got = [0; 3];
    ///         c.recv(&mut got, 0)?;
    ///         assert_eq!(got, [1, 2, 3]);
    ///     }
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn send<B: Buffer<T> + ?Sized>(&self, buf: &B, peer: usize) -> Result<()> {
        let check = || self.check_peer(peer);
        self.blocking::<NoOp>(Coll::Send, check, (buf.elems(), peer), Bufs::apart(Some(buf.place()), None))
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<B: BufferMut<T> + ?Sized>(&self, buf: &mut B, peer: usize) -> Result<()> {
        let check = || self.check_peer(peer);
        self.blocking::<NoOp>(Coll::Recv, check, (buf.elems(), peer), Bufs::apart(None, Some(buf.place_mut())))
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
