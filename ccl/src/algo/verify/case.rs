//! A verification case: the call, its ranks and buffers, and what each
//! rank's input holds and its output must hold, symbolically.

use super::{Sym, UNDEF};
use crate::algo::{Algo, Blocks, Coll};
use crate::topo::Hosts;
use std::ops::Range;

/// One verification case.
#[derive(Clone, Debug)]
pub struct Case {
    /// The call.
    pub coll: Coll,
    /// The algorithm.
    pub algo: Algo,
    /// Ranks (1..=64).
    pub nranks: usize,
    /// Element count.
    pub count: usize,
    /// Root or, for send/recv, the receiver (rank 0 sends).
    pub root: usize,
    /// Channels requested.
    pub channels: usize,
    /// Elements per pipeline piece.
    pub chunk: usize,
    /// In place or not.
    pub in_place: bool,
    /// Whether the output is written around the cache ([`Params::around`](crate::algo::Params::around)).
    pub around: bool,
    /// Host grouping.
    pub hosts: Hosts,
    /// Elements per slot.
    pub slot_elems: usize,
    /// Slots per connection.
    pub nslots: usize,
    /// Per rank, its blocks, where counts vary by rank (equal on every
    /// rank but for all-to-all): `count` is then unused.
    pub blocks: Option<Vec<Blocks>>,
}

impl Case {
    pub(super) fn full_mask(&self) -> u64 {
        if self.nranks >= 64 {
            u64::MAX
        } else {
            (1u64 << self.nranks) - 1
        }
    }

    /// Which collective rank `r` runs (send/recv cases pair rank 0 with the root).
    pub(super) fn coll_of(&self, r: usize) -> Option<(Coll, usize)> {
        match self.coll {
            Coll::Send | Coll::Recv => match r {
                0 if self.root != 0 => Some((Coll::Send, self.root)),
                r if r == self.root && r != 0 => Some((Coll::Recv, 0)),
                _ => None,
            },
            c => Some((c, self.root)),
        }
    }

    /// Block `b` as rank `r` sees it ([`Params::block`](crate::algo::Params::block)).
    pub(super) fn block(&self, r: usize, b: usize) -> Range<usize> {
        match &self.blocks {
            Some(v) => v[r].all[b].clone(),
            None => b * self.count..(b + 1) * self.count,
        }
    }

    /// The rank whose block (as rank `r` sees them) holds position `q`
    /// of the buffer of all blocks, and where that block starts.
    pub(super) fn owner(&self, r: usize, q: usize, recv: bool) -> Option<(usize, usize)> {
        match &self.blocks {
            Some(v) => {
                let of = if recv { &v[r].recv } else { &v[r].all };
                of.iter().position(|b| b.contains(&q)).map(|b| (b, of[b].start))
            }
            None => {
                let c = self.count.max(1);
                Some((q / c, q / c * c))
            }
        }
    }

    pub(super) fn initial(&self, r: usize, pos: usize) -> Sym {
        let bit = 1u64 << r;
        let idx = pos as u32;
        match self.coll {
            Coll::AllGather | Coll::Gather => Sym { idx: (self.block(r, r).start + pos) as u32, mask: bit },
            Coll::Broadcast if r != self.root => UNDEF,
            _ => Sym { idx, mask: bit },
        }
    }

    pub(super) fn expected(&self, r: usize, q: usize) -> Option<Sym> {
        let (n, all) = (self.nranks, self.full_mask());
        // from rank `b`'s block, of all blocks: the same position
        let gathered = || self.owner(r, q, false).map(|(b, _)| Sym { idx: q as u32, mask: 1 << b });
        Some(match self.coll {
            Coll::AllReduce => Sym { idx: q as u32, mask: all },
            Coll::Reduce if r == self.root => Sym { idx: q as u32, mask: all },
            Coll::Broadcast => Sym { idx: q as u32, mask: 1 << self.root },
            Coll::AllGather => gathered()?,
            Coll::ReduceScatter => Sym { idx: (self.block(r, r).start + q) as u32, mask: all },
            Coll::AllToAll => {
                let (s, at) = self.owner(r, q, true)?;
                Sym { idx: (self.block(s, r).start + q - at) as u32, mask: 1 << s }
            }
            Coll::Recv | Coll::Send if r == self.root && r != 0 => Sym { idx: q as u32, mask: 1 },
            Coll::Gather if r == self.root => gathered()?,
            Coll::Scatter => Sym { idx: (self.block(r, r).start + q) as u32, mask: 1 << self.root },
            Coll::Scan => Sym { idx: q as u32, mask: below(r + 1) },
            Coll::Exscan if r > 0 => Sym { idx: q as u32, mask: below(r) },
            _ => return None,
        })
        .filter(|_| n > 0)
    }
}

/// The ranks `0..k` as a set.
fn below(k: usize) -> u64 {
    if k >= 64 {
        u64::MAX
    } else {
        (1u64 << k) - 1
    }
}
