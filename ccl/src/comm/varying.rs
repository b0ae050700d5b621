//! Calls whose counts vary by rank on [`Communicator<T>`] (MPI's
//! `MPI_Allgatherv`, `MPI_Gatherv`, `MPI_Scatterv`, `MPI_Reduce_scatter`
//! and `MPI_Alltoallv`), blocking and non-blocking. [`Counts`] say how
//! many elements each rank has and where its block lies; every rank passes
//! the same counts (all-to-all: its own sends and receives, which must
//! match the peers'). They run the schedules of the equal-block calls,
//! on the blocks the counts place.

use super::buffer::{Buffer, BufferMut};
use super::counts::Counts;
use super::request::Request;
use super::typed::{exact, Bufs};
use super::Communicator;
use crate::algo::{Blocks, Coll};
use crate::error::Result;
use crate::op::{NoOp, ReduceOp};
use crate::Reduce;
use std::sync::Arc;

/// The blocks of a call on `counts` (all-to-all: sending on `counts`,
/// receiving on `recv`).
fn blocks(counts: &Counts, recv: Option<&Counts>) -> Arc<Blocks> {
    match recv {
        None => Arc::clone(counts.blocks()),
        Some(r) => counts.paired(r),
    }
}

impl<T: Reduce> Communicator<T> {
    /// `Ok` when `counts` are for this communicator, this rank's `own`
    /// buffer (`what`, where it has one apart: `Some`) holds its count,
    /// and `all` (the buffer of every block, where this rank has one:
    /// `Some`) reaches their extent.
    fn check_counts(
        &self,
        counts: &Counts,
        own: Option<(&'static str, usize)>,
        all: Option<(&'static str, usize)>,
    ) -> Result<()> {
        counts.check_ranks("counts", self.size())?;
        if let Some((what, len)) = own {
            exact(what, counts.count(self.rank()), len)?;
        }
        match all {
            Some((what, len)) => exact(what, counts.extent(), len),
            None => Ok(()),
        }
    }

    /// [`check_counts`](Self::check_counts) of a rooted call, whose buffer
    /// of every block only `root` has: a root in range first.
    fn check_rooted(
        &self,
        counts: &Counts,
        root: usize,
        own: (&'static str, usize),
        all: (&'static str, usize),
    ) -> Result<()> {
        self.group().check_root("root", root)?;
        self.check_counts(counts, Some(own), (self.rank() == root).then_some(all))
    }

    /// Gathers every rank's `send` (`counts.count(rank)` elements) into
    /// `recv` (`counts.extent()`), rank `r`'s at `counts.block(r)`, on
    /// every rank (MPI_Allgatherv). Elements between blocks are left as
    /// they were.
    ///
    /// ```
    /// use ccl::{testing::run_local, Counts};
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let counts = Counts::new(&[1, 0, 2])?; // rank 1 has nothing
    ///     let mine = vec![world.rank() as u16; counts.count(world.rank())];
    ///     let mut all = [0u16; 3];
    ///     world.typed::<u16>().all_gatherv(&mine, &mut all, &counts)?;
    ///     assert_eq!(all, [0, 2, 2]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn all_gatherv<S, R>(&self, send: &S, recv: &mut R, counts: &Counts) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (sl, rl) = (send.elems(), recv.elems());
        let check = || self.check_counts(counts, Some(("send buffer", sl)), Some(("recv buffer", rl)));
        let bufs = Bufs::apart(Some(send.place()), Some(recv.place_mut()));
        self.blocking_on::<NoOp>(Coll::AllGather, check, (0, 0, Some(blocks(counts, None))), bufs)
    }

    /// [`all_gatherv`](Self::all_gatherv) in place: `buf` holds every
    /// block, this rank's (at `counts.block(rank)`) already in place.
    pub fn all_gatherv_in_place<B: BufferMut<T> + ?Sized>(&self, buf: &mut B, counts: &Counts) -> Result<()> {
        let len = buf.elems();
        let check = || self.check_counts(counts, None, Some(("buffer", len)));
        let bufs = Bufs::alone(Some(buf.place_mut()));
        self.blocking_on::<NoOp>(Coll::AllGather, check, (0, 0, Some(blocks(counts, None))), bufs)
    }

    /// Gathers every rank's `send` (`counts.count(rank)` elements) into
    /// `root`'s `recv` (`counts.extent()`), rank `r`'s at
    /// `counts.block(r)` (MPI_Gatherv). `recv` is ignored, and may be
    /// empty, on other ranks.
    ///
    /// ```
    /// use ccl::{testing::run_local, Counts};
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let r = world.rank();
    ///     let counts = Counts::with_displs(&[1, 2, 1], &[3, 0, 2])?; // any order
    ///     let mine = vec![r as u8 + 1; counts.count(r)];
    ///     let mut all = if r == 0 { vec![0u8; 4] } else { vec![] };
    ///     world.typed::<u8>().gatherv(&mine, &mut all, &counts, 0)?;
    ///     if r == 0 {
    ///         assert_eq!(all, [2, 2, 3, 1]);
    ///     }
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn gatherv<S, R>(&self, send: &S, recv: &mut R, counts: &Counts, root: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (sl, rl, me) = (send.elems(), recv.elems(), self.rank());
        let check = || self.check_rooted(counts, root, ("send buffer", sl), ("recv buffer", rl));
        let out = (me == root || rl > 0).then(|| recv.place_mut());
        let bufs = Bufs::apart(Some(send.place()), out);
        self.blocking_on::<NoOp>(Coll::Gather, check, (0, root, Some(blocks(counts, None))), bufs)
    }

    /// Scatters `root`'s `send` (`counts.extent()`): rank `r` gets
    /// `counts.block(r)` of it in `recv` (`counts.count(r)` elements)
    /// (MPI_Scatterv). `send` is ignored, and may be empty, on other ranks.
    pub fn scatterv<S, R>(&self, send: &S, recv: &mut R, counts: &Counts, root: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (sl, rl, me) = (send.elems(), recv.elems(), self.rank());
        let check = || self.check_rooted(counts, root, ("recv buffer", rl), ("send buffer", sl));
        let input = (me == root || sl > 0).then(|| send.place());
        let bufs = Bufs::apart(input, Some(recv.place_mut()));
        self.blocking_on::<NoOp>(Coll::Scatter, check, (0, root, Some(blocks(counts, None))), bufs)
    }

    /// Reduces `send` (`counts.extent()`) over all ranks; rank `r` gets
    /// `counts.block(r)` of the result in `recv` (`counts.count(r)`
    /// elements) (MPI_Reduce_scatter).
    ///
    /// ```
    /// use ccl::{testing::run_local, Counts, Sum};
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let counts = Counts::new(&[3, 1])?;
    ///     let send = [1i32, 2, 3, 4];
    ///     let mut mine = vec![0; counts.count(world.rank())];
    ///     world.typed::<i32>().reduce_scatterv(&send, &mut mine, &counts, Sum)?;
    ///     assert_eq!(mine, if world.rank() == 0 { vec![2, 4, 6] } else { vec![8] });
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn reduce_scatterv<S, R, O>(&self, send: &S, recv: &mut R, counts: &Counts, _op: O) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
        O: ReduceOp<T>,
    {
        let (sl, rl) = (send.elems(), recv.elems());
        let check = || self.check_counts(counts, Some(("recv buffer", rl)), Some(("send buffer", sl)));
        let bufs = Bufs::apart(Some(send.place()), Some(recv.place_mut()));
        self.blocking_on::<O>(Coll::ReduceScatter, check, (0, 0, Some(blocks(counts, None))), bufs)
    }

    /// Sends `sends.block(d)` of `send` to rank `d`, and receives from
    /// rank `s` into `recvs.block(s)` of `recv` (MPI_Alltoallv): `send`
    /// holds `sends.extent()` elements, `recv` `recvs.extent()`. What rank
    /// `s` sends rank `d` must be as long as what `d` receives from `s`.
    ///
    /// ```
    /// use ccl::{testing::run_local, Counts};
    /// let done = run_local(2, |world| -> ccl::Result<()> {
    ///     let r = world.rank();
    ///     // rank r sends r + 1 elements to each rank
    ///     let sends = Counts::new(&[r + 1, r + 1])?;
    ///     let recvs = Counts::new(&[1, 2])?;
    ///     let send = vec![r as u32; 2 * (r + 1)];
    ///     let mut recv = [9u32; 3];
    ///     world.typed::<u32>().all_to_allv(&send, &sends, &mut recv, &recvs)?;
    ///     assert_eq!(recv, [0, 1, 1]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn all_to_allv<S, R>(&self, send: &S, sends: &Counts, recv: &mut R, recvs: &Counts) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (sl, rl) = (send.elems(), recv.elems());
        let check = || {
            sends.check_ranks("send counts", self.size())?;
            recvs.check_ranks("receive counts", self.size())?;
            exact("send buffer", sends.extent(), sl)?;
            exact("recv buffer", recvs.extent(), rl)
        };
        let bufs = Bufs::apart(Some(send.place()), Some(recv.place_mut()));
        self.blocking_on::<NoOp>(Coll::AllToAll, check, (0, 0, Some(blocks(sends, Some(recvs)))), bufs)
    }

    /// Starts `coll` on blocks `b` from `send` into `out`, which the
    /// request returns.
    fn start_on<O: ReduceOp<T>>(
        &self,
        (coll, root, b): (Coll, usize, Arc<Blocks>),
        check: impl FnOnce() -> Result<()>,
        send: Vec<T>,
        mut out: Vec<T>,
    ) -> Request<Vec<T>> {
        let mut call = self.call(coll, 0, root, send.as_ptr(), out.as_mut_ptr(), false);
        call.blocks = Some(b);
        self.start::<O, _>(coll, check, call, move || {
            drop(send);
            out
        })
    }

    /// Non-blocking [`all_gatherv`](Self::all_gatherv); the request
    /// returns the `counts.extent()` gathered elements (zero between
    /// blocks).
    pub fn iall_gatherv(&self, send: Vec<T>, counts: &Counts) -> Request<Vec<T>> {
        let sl = send.len();
        let check = || self.check_counts(counts, Some(("send buffer", sl)), None);
        let out = vec![T::zeroed(); counts.extent()];
        self.start_on::<NoOp>((Coll::AllGather, 0, blocks(counts, None)), check, send, out)
    }

    /// Non-blocking [`gatherv`](Self::gatherv); the request returns the
    /// `counts.extent()` gathered elements on `root`, and nothing (an
    /// empty `Vec`) elsewhere.
    pub fn igatherv(&self, send: Vec<T>, counts: &Counts, root: usize) -> Request<Vec<T>> {
        let sl = send.len();
        let check = || {
            self.group().check_root("root", root)?;
            self.check_counts(counts, Some(("send buffer", sl)), None)
        };
        let out = if self.rank() == root { vec![T::zeroed(); counts.extent()] } else { Vec::new() };
        self.start_on::<NoOp>((Coll::Gather, root, blocks(counts, None)), check, send, out)
    }

    /// Non-blocking [`scatterv`](Self::scatterv); the request returns this
    /// rank's `counts.count(rank)` elements (`send` may be empty on ranks
    /// other than `root`).
    pub fn iscatterv(&self, send: Vec<T>, counts: &Counts, root: usize) -> Request<Vec<T>> {
        let sl = send.len();
        let out = vec![T::zeroed(); counts.count(self.rank())];
        let checked = self.check_rooted(counts, root, ("recv buffer", out.len()), ("send buffer", sl));
        self.start_on::<NoOp>((Coll::Scatter, root, blocks(counts, None)), || checked, send, out)
    }

    /// Non-blocking [`reduce_scatterv`](Self::reduce_scatterv); the
    /// request returns this rank's `counts.count(rank)` elements of the
    /// result.
    pub fn ireduce_scatterv<O: ReduceOp<T>>(&self, send: Vec<T>, counts: &Counts, _op: O) -> Request<Vec<T>> {
        let sl = send.len();
        let out = vec![T::zeroed(); counts.count(self.rank())];
        let checked = self.check_counts(counts, Some(("recv buffer", out.len())), Some(("send buffer", sl)));
        self.start_on::<O>((Coll::ReduceScatter, 0, blocks(counts, None)), || checked, send, out)
    }

    /// Non-blocking [`all_to_allv`](Self::all_to_allv); the request
    /// returns the `recvs.extent()` elements received (zero between
    /// blocks).
    pub fn iall_to_allv(&self, send: Vec<T>, sends: &Counts, recvs: &Counts) -> Request<Vec<T>> {
        let sl = send.len();
        let check = || {
            sends.check_ranks("send counts", self.size())?;
            recvs.check_ranks("receive counts", self.size())?;
            exact("send buffer", sends.extent(), sl)
        };
        let out = vec![T::zeroed(); recvs.extent()];
        self.start_on::<NoOp>((Coll::AllToAll, 0, blocks(sends, Some(recvs))), check, send, out)
    }
}
