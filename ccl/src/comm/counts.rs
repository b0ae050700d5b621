//! [`Counts`]: how many elements each rank contributes to a call whose
//! counts vary by rank, and where each rank's block lies (MPI's counts and
//! displacements), checked once when made.

use crate::algo::blocks::{extent, Blocks};
use crate::error::{Error, Result};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Per-rank element counts, and where each rank's block lies in the
/// buffer that holds them all: rank order, one after the other
/// ([`new`](Self::new)), or at given displacements
/// ([`with_displs`](Self::with_displs)). Blocks never overlap. Cheap to
/// clone.
///
/// ```
/// let c = ccl::Counts::new(&[2, 0, 3])?;
/// assert_eq!((c.ranks(), c.total(), c.extent()), (3, 5, 5));
/// assert_eq!(c.block(2), 2..5);
/// let d = ccl::Counts::with_displs(&[1, 1], &[3, 0])?;
/// assert_eq!((d.block(0), d.extent()), (3..4, 4));
/// assert!(ccl::Counts::with_displs(&[2, 2], &[0, 1]).is_err()); // overlap
/// # Ok::<(), ccl::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Counts {
    /// As calls take them (hashed once).
    blocks: Arc<Blocks>,
    /// The blocks of the last all-to-allv sending on these counts, and
    /// the receiving counts it took ([`paired`](Self::paired)).
    last_pair: Arc<Mutex<Option<Pair>>>,
}

/// Receiving blocks, and an all-to-allv's blocks with them.
type Pair = (Arc<Blocks>, Arc<Blocks>);

impl PartialEq for Counts {
    fn eq(&self, other: &Self) -> bool {
        self.blocks.all == other.blocks.all
    }
}

impl Eq for Counts {}

impl Counts {
    /// `counts[r]` elements for rank `r`, blocks in rank order without
    /// gaps. `Err` where their sum overflows.
    pub fn new(counts: &[usize]) -> Result<Self> {
        counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).ok_or_else(|| overflow(counts))?;
        Ok(Counts::of(Blocks::packed(counts)))
    }

    /// `counts[r]` elements for rank `r` from element `displs[r]` of the
    /// buffer of all blocks. `Err` where the two differ in length, a block
    /// ends past `usize::MAX`, or two blocks share an element.
    pub fn with_displs(counts: &[usize], displs: &[usize]) -> Result<Self> {
        if counts.len() != displs.len() {
            let (c, d) = (counts.len(), displs.len());
            return Err(Error::invalid(format!("{c} counts but {d} displacements")));
        }
        if counts.iter().zip(displs).any(|(&c, &d)| d.checked_add(c).is_none()) {
            return Err(overflow(counts));
        }
        let blocks = Blocks::at(counts, displs);
        let mut order: Vec<usize> = (0..blocks.len()).filter(|&r| !blocks[r].is_empty()).collect();
        order.sort_by_key(|&r| blocks[r].start);
        if let Some(w) = order.windows(2).find(|w| blocks[w[0]].end > blocks[w[1]].start) {
            let (a, b) = (w[0], w[1]);
            return Err(Error::invalid(format!(
                "the blocks of ranks {a} ({:?}) and {b} ({:?}) overlap",
                blocks[a], blocks[b]
            )));
        }
        Ok(Counts::of(blocks))
    }

    fn of(blocks: Box<[Range<usize>]>) -> Self {
        Counts { blocks: Arc::new(Blocks::new(blocks, Box::new([]))), last_pair: Arc::default() }
    }

    /// The blocks of an all-to-allv sending on these counts and receiving
    /// on `recvs`: made once while a loop repeats the call on the same
    /// counts.
    pub(crate) fn paired(&self, recvs: &Counts) -> Arc<Blocks> {
        let mut last = self.last_pair.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((r, b)) if Arc::ptr_eq(r, &recvs.blocks) => Arc::clone(b),
            _ => {
                let b = Arc::new(Blocks::new(self.blocks.all.clone(), recvs.blocks.all.clone()));
                *last = Some((Arc::clone(&recvs.blocks), Arc::clone(&b)));
                b
            }
        }
    }

    /// Ranks counted.
    pub fn ranks(&self) -> usize {
        self.blocks.all.len()
    }

    /// Rank `r`'s count (0 past the last rank).
    pub fn count(&self, r: usize) -> usize {
        self.blocks.all.get(r).map_or(0, |b| b.len())
    }

    /// Rank `r`'s block in the buffer of all blocks (empty past the last rank).
    pub fn block(&self, r: usize) -> Range<usize> {
        self.blocks.all.get(r).cloned().unwrap_or(0..0)
    }

    /// Elements over all ranks.
    pub fn total(&self) -> usize {
        self.blocks.all.iter().map(|b| b.len()).sum()
    }

    /// Elements of the buffer of all blocks: one past the last block's end.
    pub fn extent(&self) -> usize {
        extent(&self.blocks.all)
    }

    /// Every block, as a call takes them.
    pub(crate) fn blocks(&self) -> &Arc<Blocks> {
        &self.blocks
    }

    /// `Ok` when these counts are for a communicator of `size` ranks.
    pub(crate) fn check_ranks(&self, what: &str, size: usize) -> Result<()> {
        if self.ranks() == size {
            Ok(())
        } else {
            Err(Error::invalid(format!("{what} name {} ranks, on a communicator of {size}", self.ranks())))
        }
    }
}

fn overflow(counts: &[usize]) -> Error {
    Error::invalid(format!("counts overflow: {counts:?} do not fit one buffer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_counts_are_refused_with_what_is_wrong() {
        let e = |r: Result<Counts>| r.expect_err("refused").to_string();
        assert!(e(Counts::new(&[usize::MAX, 1])).contains("overflow"));
        assert!(e(Counts::with_displs(&[1], &[usize::MAX])).contains("overflow"));
        assert!(e(Counts::with_displs(&[1, 2], &[0])).contains("2 counts but 1 displacements"));
        assert!(e(Counts::with_displs(&[3, 2, 2], &[5, 0, 1])).contains("ranks 1 (0..2) and 2 (1..3) overlap"));
        // empty blocks overlap nothing; gaps and any order are fine
        let c = Counts::with_displs(&[2, 0, 1], &[4, 4, 0]).expect("fine");
        assert_eq!((c.total(), c.extent(), c.count(1), c.block(9)), (3, 6, 0, 0..0));
    }
}
