//! Prefix reductions on [`Communicator<T>`]: `scan` (MPI_Scan) and
//! `exscan` (MPI_Exscan), with any [`ReduceOp`], derived ones included;
//! blocking, in place or into another buffer, and non-blocking.

use super::buffer::{Buffer, BufferMut};
use super::request::Request;
use super::typed::exact;
use super::Communicator;
use crate::algo::Coll;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::Reduce;

impl<T: Reduce> Communicator<T> {
    /// Inclusive prefix reduction in place: afterwards rank `r`'s `buf`
    /// holds `op` applied element-wise to the `buf`s of ranks `0..=r`.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let mut v = [world.rank() as i64 + 1];
    ///     world.typed::<i64>().scan(&mut v, Sum)?;
    ///     assert_eq!(v[0], [1, 3, 6][world.rank()]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn scan<B: BufferMut<T> + ?Sized, O: ReduceOp<T>>(&self, buf: &mut B, _op: O) -> Result<()> {
        let n = buf.elems();
        self.blocking::<O>(Coll::Scan, || Ok(()), (n, 0), self.in_place(buf))
    }

    /// [`scan`](Self::scan) from `send` into `recv` (same length).
    pub fn scan_into<S, R, O>(&self, send: &S, recv: &mut R, _op: O) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let (n, rl) = (send.elems(), recv.elems());
        self.blocking::<O>(Coll::Scan, || exact("recv buffer", n, rl), (n, 0), self.between(send, recv))
    }

    /// Exclusive prefix reduction in place: afterwards rank `r > 0`'s
    /// `buf` holds `op` applied to the `buf`s of ranks `0..r`; rank 0's is
    /// left as it was (MPI leaves it undefined).
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// use ccl::Sum;
    /// // each rank's offset into a file of all ranks' records
    /// let done = run_local(3, |world| -> ccl::Result<u64> {
    ///     let mine = [10 * (world.rank() as u64 + 1)]; // records of this rank
    ///     let mut at = [0u64];
    ///     world.typed::<u64>().exscan_into(&mine, &mut at, Sum)?;
    ///     Ok(at[0])
    /// });
    /// let at: Vec<u64> = done.into_iter().map(Result::unwrap).collect();
    /// assert_eq!(at, [0, 10, 30]); // rank 0's stays as it was: 0
    /// ```
    pub fn exscan<B: BufferMut<T> + ?Sized, O: ReduceOp<T>>(&self, buf: &mut B, _op: O) -> Result<()> {
        let n = buf.elems();
        self.blocking::<O>(Coll::Exscan, || Ok(()), (n, 0), self.in_place(buf))
    }

    /// [`exscan`](Self::exscan) from `send` into `recv` (same length);
    /// rank 0's `recv` is left as it was.
    pub fn exscan_into<S, R, O>(&self, send: &S, recv: &mut R, _op: O) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let (n, rl) = (send.elems(), recv.elems());
        self.blocking::<O>(Coll::Exscan, || exact("recv buffer", n, rl), (n, 0), self.between(send, recv))
    }

    /// Non-blocking [`scan`](Self::scan); the request returns `buf`.
    pub fn iscan<O: ReduceOp<T>>(&self, mut buf: Vec<T>, _op: O) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        self.start::<O, _>(Coll::Scan, || Ok(()), self.call(Coll::Scan, n, 0, p, p, true), move || buf)
    }

    /// Non-blocking [`exscan`](Self::exscan); the request returns `buf`.
    pub fn iexscan<O: ReduceOp<T>>(&self, mut buf: Vec<T>, _op: O) -> Request<Vec<T>> {
        let (n, p) = (buf.len(), buf.as_mut_ptr());
        self.start::<O, _>(Coll::Exscan, || Ok(()), self.call(Coll::Exscan, n, 0, p, p, true), move || buf)
    }
}
