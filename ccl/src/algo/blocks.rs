//! Blocks of calls whose counts vary by rank (MPI's v-collectives): where
//! each rank's block lies in the buffer that holds every rank's.
//!
//! The generators of all-gather, reduce-scatter, gather, scatter and
//! all-to-all place blocks through [`Params::block`] (and
//! [`Params::recv_block`]), which is block `r` of `count` elements where
//! counts are equal, and the call's own ranges where they vary: one
//! schedule serves both.

use super::schedule::{InPlace, Layout};
use super::{Coll, Params};
use std::ops::Range;

/// Every rank's block, for a call with per-rank counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Blocks {
    /// Block `r`, of rank `r`: in the output of all-gather and gather, the
    /// input of scatter and reduce-scatter; all-to-all: what this rank
    /// sends rank `r`, in its input.
    pub all: Box<[Range<usize>]>,
    /// All-to-all only: what this rank receives from rank `r`, in its
    /// output (empty for the other calls).
    pub recv: Box<[Range<usize>]>,
    /// [`hash`](Self::hash), computed once.
    hash: u64,
}

/// One past the last element of `blocks` (0 for none).
pub fn extent(blocks: &[Range<usize>]) -> usize {
    blocks.iter().map(|b| b.end).max().unwrap_or(0)
}

impl Blocks {
    /// The blocks `all` and (all-to-all) `recv`.
    pub fn new(all: Box<[Range<usize>]>, recv: Box<[Range<usize>]>) -> Self {
        // word by word (FxHash's step), the sides told apart
        let step = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
        let side = |h: u64, bs: &[Range<usize>]| bs.iter().fold(h, |h, b| step(step(h, b.start as u64), b.end as u64));
        let hash = side(step(side(0, &all), u64::MAX), &recv);
        Blocks { all, recv, hash: hash ^ hash >> 29 }
    }

    /// Blocks of `counts[r]` elements at `displs[r]`.
    pub fn at(counts: &[usize], displs: &[usize]) -> Box<[Range<usize>]> {
        counts.iter().zip(displs).map(|(&c, &d)| d..d + c).collect()
    }

    /// Blocks of `counts`, one after the other in rank order.
    pub fn packed(counts: &[usize]) -> Box<[Range<usize>]> {
        let mut at = 0;
        counts
            .iter()
            .map(|&c| {
                at += c;
                at - c..at
            })
            .collect()
    }

    /// The largest block (a call's size class: ring steps are as slow as
    /// their largest block).
    pub fn largest(&self) -> usize {
        self.all.iter().chain(self.recv.iter()).map(|b| b.len()).max().unwrap_or(0)
    }

    /// A 64-bit hash of every block (what the ranks must agree on).
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The buffers of rank `rank`'s call of `coll` on these blocks (see
    /// [`Coll::layout`]); `None` for a call that has no variable form.
    pub fn layout(&self, coll: Coll, rank: usize, root: usize, in_place: bool) -> Option<Layout> {
        let own = self.all.get(rank)?.clone();
        let ext = extent(&self.all);
        let whole = |len: usize| InPlace { len, input_off: 0, output_off: 0 };
        let gathered = InPlace { len: ext, input_off: own.start, output_off: 0 };
        let scattered = InPlace { len: ext, input_off: 0, output_off: own.start };
        let (input, output, ip) = match coll {
            Coll::AllGather => (own.len(), ext, gathered),
            Coll::Gather if rank == root => (own.len(), ext, gathered),
            Coll::Gather => (own.len(), 0, whole(own.len())),
            Coll::ReduceScatter => (ext, own.len(), scattered),
            Coll::Scatter if rank == root => (ext, own.len(), scattered),
            Coll::Scatter => (0, own.len(), whole(own.len())),
            // (no in-place form: the two sides' blocks differ)
            Coll::AllToAll if !in_place => (ext, extent(&self.recv), whole(0)),
            _ => return None,
        };
        Some(Layout { input, output, in_place: in_place.then_some(ip) })
    }
}

impl Params<'_> {
    /// Rank `r`'s block (see [`Blocks::all`]): `r × count` on, `count`
    /// long, where counts are equal.
    #[inline]
    pub fn block(&self, r: usize) -> Range<usize> {
        match self.blocks {
            Some(b) => b.all[r].clone(),
            None => r * self.count..(r + 1) * self.count,
        }
    }

    /// All-to-all: the block received from rank `r`, in the output.
    #[inline]
    pub fn recv_block(&self, r: usize) -> Range<usize> {
        match self.blocks {
            Some(b) => b.recv[r].clone(),
            None => r * self.count..(r + 1) * self.count,
        }
    }

    /// The buffers of this rank's call of `coll`.
    pub fn layout(&self, coll: Coll) -> Option<Layout> {
        match self.blocks {
            Some(b) => b.layout(coll, self.rank, self.root, self.in_place),
            None => Some(coll.layout(self.nranks, self.rank, self.count, self.root, self.in_place)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_blocks_follow_each_other() {
        assert_eq!(&*Blocks::packed(&[2, 0, 3]), &[0..2, 2..2, 2..5]);
        assert_eq!(extent(&Blocks::packed(&[2, 0, 3])), 5);
        assert_eq!(&*Blocks::at(&[1, 2], &[4, 0]), &[4..5, 0..2]);
    }

    #[test]
    fn the_hash_tells_blocks_apart() {
        let b = |all: &[usize]| Blocks::new(Blocks::packed(all), Box::new([]));
        assert_ne!(b(&[1, 2]).hash(), b(&[2, 1]).hash());
        assert_eq!(b(&[1, 2]).hash(), b(&[1, 2]).hash());
    }

    #[test]
    fn equal_blocks_lay_out_as_the_equal_call() {
        let b = Blocks::new(Blocks::packed(&[3; 4]), Blocks::packed(&[3; 4]));
        for coll in [Coll::AllGather, Coll::ReduceScatter, Coll::Gather, Coll::Scatter, Coll::AllToAll] {
            for in_place in [false, true] {
                let (rank, root) = (2, 1);
                let got = b.layout(coll, rank, root, in_place);
                if coll == Coll::AllToAll && in_place {
                    assert_eq!(got, None);
                    continue;
                }
                assert_eq!(got, Some(coll.layout(4, rank, 3, root, in_place)), "{coll} in place {in_place}");
            }
        }
    }
}
