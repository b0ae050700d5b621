//! Gather and scatter on [`Communicator<T>`] (MPI's `MPI_Gather` and
//! `MPI_Scatter`, NCCL's `ncclGather` and `ncclScatter`), blocking, in
//! place and non-blocking. Counts are per rank: the root's buffer holds
//! `size × count` elements, block `r` for rank `r`.

use super::buffer::{Buffer, BufferMut};
use super::request::Request;
use super::typed::{divisible, exact, Bufs};
use super::Communicator;
use crate::algo::Coll;
use crate::error::Result;
use crate::op::NoOp;
use crate::Reduce;

impl<T: Reduce> Communicator<T> {
    /// `Ok` for a root in range whose buffer of all blocks (`what`, of
    /// `got` elements) holds `want`; other ranks' is not looked at.
    fn check_all_blocks(&self, root: usize, what: &'static str, want: usize, got: usize) -> Result<()> {
        self.group().check_root("root", root)?;
        if self.rank() == root {
            exact(what, want, got)?;
        }
        Ok(())
    }

    /// Gather or scatter in place on `buf`: `size` blocks on `root`, one elsewhere.
    fn rooted_in_place<B: BufferMut<T> + ?Sized>(&self, coll: Coll, buf: &mut B, root: usize) -> Result<()> {
        let (len, s, me) = (buf.elems(), self.size(), self.rank());
        let check = || {
            self.group().check_root("root", root)?;
            if me == root {
                divisible(len, s)?;
            }
            Ok(())
        };
        let count = if me == root { len / s } else { len };
        self.blocking::<NoOp>(coll, check, (count, root), self.in_place(buf))
    }

    /// Gathers every rank's `send` into `root`'s `recv` (`size ×
    /// send.len()`), in rank order; `recv` is ignored, and may be empty, on
    /// other ranks. Every rank sends as many elements.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let mine = [world.rank() as u8; 2];
    ///     let mut all = if world.rank() == 1 { vec![0u8; 6] } else { vec![] };
    ///     world.typed::<u8>().gather(&mine, &mut all, 1)?;
    ///     if world.rank() == 1 {
    ///         assert_eq!(all, [0, 0, 1, 1, 2, 2]);
    ///     }
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn gather<S, R>(&self, send: &S, recv: &mut R, root: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (n, rl, me) = (send.elems(), recv.elems(), self.rank());
        let check = || self.check_all_blocks(root, "recv buffer", n.saturating_mul(self.size()), rl);
        let out = (me == root || rl > 0).then(|| recv.place_mut());
        self.blocking::<NoOp>(Coll::Gather, check, (n, root), Bufs::apart(Some(send.place()), out))
    }

    /// Gather in place: on `root`, `buf` holds `size` blocks, its own (at
    /// `root × len/size`) already in place; on other ranks `buf` is the
    /// block they send.
    pub fn gather_in_place<B: BufferMut<T> + ?Sized>(&self, buf: &mut B, root: usize) -> Result<()> {
        self.rooted_in_place(Coll::Gather, buf, root)
    }

    /// Scatters `root`'s `send` (`size × recv.len()`): rank `r` gets block
    /// `r` in `recv`. `send` is ignored, and may be empty, on other ranks.
    ///
    /// ```
    /// use ccl::testing::run_local;
    /// let done = run_local(3, |world| -> ccl::Result<()> {
    ///     let all: Vec<u32> = if world.rank() == 0 { (0..6).collect() } else { vec![] };
    ///     let mut mine = [0u32; 2];
    ///     world.typed::<u32>().scatter(&all, &mut mine, 0)?;
    ///     let r = 2 * world.rank() as u32;
    ///     assert_eq!(mine, [r, r + 1]);
    ///     Ok(())
    /// });
    /// assert!(done.iter().all(Result::is_ok));
    /// ```
    pub fn scatter<S, R>(&self, send: &S, recv: &mut R, root: usize) -> Result<()>
    where
        S: Buffer<T> + ?Sized,
        R: BufferMut<T> + ?Sized,
    {
        let (n, sl, me) = (recv.elems(), send.elems(), self.rank());
        let check = || self.check_all_blocks(root, "send buffer", n.saturating_mul(self.size()), sl);
        let input = (me == root || sl > 0).then(|| send.place());
        self.blocking::<NoOp>(Coll::Scatter, check, (n, root), Bufs::apart(input, Some(recv.place_mut())))
    }

    /// Scatter in place: on `root`, `buf` holds `size` blocks, of which
    /// its own (at `root × len/size`) stays where it is; on other ranks
    /// `buf` receives their block.
    pub fn scatter_in_place<B: BufferMut<T> + ?Sized>(&self, buf: &mut B, root: usize) -> Result<()> {
        self.rooted_in_place(Coll::Scatter, buf, root)
    }

    /// Non-blocking [`gather`](Self::gather): the request returns the
    /// `size × send.len()` gathered elements on `root`, and nothing (an
    /// empty `Vec`) on other ranks.
    pub fn igather(&self, send: Vec<T>, root: usize) -> Request<Vec<T>> {
        let (n, me) = (send.len(), self.rank());
        let check = || self.group().check_root("root", root);
        let mut out = if me == root { vec![T::zeroed(); n.saturating_mul(self.size())] } else { Vec::new() };
        let (i, o) = (send.as_ptr(), out.as_mut_ptr());
        let call = self.call(Coll::Gather, n, root, i, o, false);
        self.start::<NoOp, _>(Coll::Gather, check, call, move || {
            drop(send);
            out
        })
    }

    /// Non-blocking [`scatter`](Self::scatter) into `recv`: the request
    /// returns `recv` holding this rank's block of `root`'s `send` (which
    /// other ranks may leave empty).
    pub fn iscatter(&self, send: Vec<T>, mut recv: Vec<T>, root: usize) -> Request<Vec<T>> {
        let (n, sl) = (recv.len(), send.len());
        let check = || self.check_all_blocks(root, "send buffer", n.saturating_mul(self.size()), sl);
        let (i, o) = (send.as_ptr(), recv.as_mut_ptr());
        let call = self.call(Coll::Scatter, n, root, i, o, false);
        self.start::<NoOp, _>(Coll::Scatter, check, call, move || {
            drop(send);
            recv
        })
    }
}
