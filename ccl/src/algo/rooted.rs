//! Gather and scatter: straight to and from the root, or along a binomial
//! tree (the root then takes ⌈log2 n⌉ messages instead of n - 1, as MPI
//! does for small blocks).
//!
//! In the tree, ranks are numbered relative to the root (`v = rank - root`
//! mod n); rank `v` heads the subtree of the `lowbit(v)` ranks from `v`
//! (the root: all of them), and its children are `v + 1, v + 2, v + 4, …`
//! below that. A subtree's blocks are consecutive in relative order, so a
//! rank keeps those of its subtree but its own in scratch, in that order.
//! Both ends of a message cut a subtree's blocks alike (`Tree::segments`): its
//! head's own block apart, and where the relative order wraps past rank
//! `n - 1` to rank 0.

use super::part::{exchange, split, Into};
use super::schedule::{Buf, Region, Schedule, Step};
use super::Params;
use std::ops::Range;

/// Gather, direct: every rank sends its block to the root, which takes
/// them in rank order, one after the other.
pub fn gather_direct(p: &Params) -> Schedule {
    direct(p, true)
}

/// Scatter, direct: the root sends each rank its block, in rank order.
pub fn scatter_direct(p: &Params) -> Schedule {
    direct(p, false)
}

/// Blocks straight to the root (`to_root`: gather) or from it (scatter).
fn direct(p: &Params, to_root: bool) -> Schedule {
    let (n, count, r, root) = (p.nranks, p.count, p.rank, p.root);
    // the root's buffer of all blocks, and every rank's own one
    let (all, own) = if to_root { (Buf::Output, Buf::Input) } else { (Buf::Input, Buf::Output) };
    let channels = split(0..count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            let mine = Region::new(own, sub.start, sub.len());
            let block = |q: usize| Region::new(all, q * count + sub.start, sub.len());
            // a gather's root takes and its other ranks send; a scatter's
            // the other way round
            let sends = to_root != (r == root);
            let pass = |ch: &mut Vec<Step>, peer: usize, region: Region| {
                let (send, recv): (&[Region], &[Region]) = if sends { (&[region], &[]) } else { (&[], &[region]) };
                exchange(ch, peer, send, recv, p.chunk, Into::Copy);
            };
            if r == root {
                let (src, dst) = if to_root { (mine, block(r)) } else { (block(r), mine) };
                ch.push(Step::Copy { src, dst });
                for q in (0..n).filter(|&q| q != root) {
                    pass(&mut ch, q, block(q));
                }
            } else {
                pass(&mut ch, root, mine);
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// A rank's place in the binomial tree rooted at `root`.
struct Tree {
    n: usize,
    root: usize,
    count: usize,
    /// This rank, relative to the root.
    v: usize,
}

impl Tree {
    fn new(p: &Params) -> Self {
        Tree { n: p.nranks, root: p.root, count: p.count, v: (p.rank + p.nranks - p.root) % p.nranks }
    }

    /// Ranks in the subtree headed by relative rank `v`.
    fn size(&self, v: usize) -> usize {
        let low = if v == 0 { self.n } else { 1 << v.trailing_zeros() };
        low.min(self.n - v)
    }

    /// Relative ranks of this rank's children, nearest (smallest subtree) first.
    fn children(&self) -> Vec<usize> {
        let v = self.v;
        (0..usize::BITS).map(|b| 1usize << b).take_while(|&m| m < self.size(v)).map(|m| v + m).collect()
    }

    /// The parent's communicator rank.
    fn parent(&self) -> usize {
        let up = self.v - (1 << self.v.trailing_zeros());
        (up + self.root) % self.n
    }

    /// The communicator rank of relative rank `u`.
    fn abs(&self, u: usize) -> usize {
        (u + self.root) % self.n
    }

    /// Subtree `u..u+size(u)` cut as both ends of its message cut it: the
    /// head's block apart, and apart where the relative order wraps.
    fn segments(&self, u: usize) -> Vec<Range<usize>> {
        let end = u + self.size(u);
        let wrap = self.n - self.root;
        let mut cuts = vec![u, u + 1, end];
        if wrap > u + 1 && wrap < end {
            cuts.insert(2, wrap);
        }
        cuts.windows(2).map(|w| w[0]..w[1]).filter(|s| !s.is_empty()).collect()
    }

    /// Where this rank keeps the blocks `seg` (relative) of its subtree,
    /// on channel `sub`: the root in `whole` (the user's n blocks, in rank
    /// order), another rank its own block in `own` and the others in
    /// scratch. One region per block, or one for them all where the
    /// channel holds whole blocks.
    fn place(&self, seg: &Range<usize>, sub: &Range<usize>, whole: Buf, own: Buf) -> Vec<Region> {
        let (buf, first) = if self.v == 0 {
            (whole, self.abs(seg.start))
        } else if seg.start == self.v {
            (own, 0)
        } else {
            (Buf::Scratch, seg.start - self.v - 1)
        };
        let count = self.count;
        if sub.len() == count {
            return vec![Region::new(buf, first * count, seg.len() * count)];
        }
        (0..seg.len()).map(|i| Region::new(buf, (first + i) * count + sub.start, sub.len())).collect()
    }

    /// Elements of scratch: the subtree's blocks but this rank's own.
    fn scratch(&self) -> usize {
        if self.v == 0 {
            0
        } else {
            (self.size(self.v) - 1) * self.count
        }
    }
}

/// Gather along a binomial tree: each rank takes its children's subtrees,
/// nearest first, and passes its own subtree up.
pub fn gather_tree(p: &Params) -> Schedule {
    let t = Tree::new(p);
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            if t.v == 0 {
                let own = Region::new(Buf::Input, sub.start, sub.len());
                ch.push(Step::Copy { src: own, dst: Region::new(Buf::Output, p.rank * p.count + sub.start, sub.len()) });
            }
            for c in t.children() {
                for seg in t.segments(c) {
                    let dst = t.place(&seg, sub, Buf::Output, Buf::Input);
                    exchange(&mut ch, t.abs(c), &[], &dst, p.chunk, Into::Copy);
                }
            }
            if t.v != 0 {
                for seg in t.segments(t.v) {
                    let src = t.place(&seg, sub, Buf::Output, Buf::Input);
                    exchange(&mut ch, t.parent(), &src, &[], p.chunk, Into::Copy);
                }
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: t.scratch() }
}

/// Scatter along a binomial tree: each rank takes its subtree's blocks
/// from its parent and passes its children theirs, farthest (largest
/// subtree) first.
pub fn scatter_tree(p: &Params) -> Schedule {
    let t = Tree::new(p);
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            if t.v == 0 {
                let src = Region::new(Buf::Input, p.rank * p.count + sub.start, sub.len());
                ch.push(Step::Copy { src, dst: Region::new(Buf::Output, sub.start, sub.len()) });
            } else {
                for seg in t.segments(t.v) {
                    let dst = t.place(&seg, sub, Buf::Input, Buf::Output);
                    exchange(&mut ch, t.parent(), &[], &dst, p.chunk, Into::Copy);
                }
            }
            for c in t.children().into_iter().rev() {
                for seg in t.segments(c) {
                    let src = t.place(&seg, sub, Buf::Input, Buf::Output);
                    exchange(&mut ch, t.abs(c), &src, &[], p.chunk, Into::Copy);
                }
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: t.scratch() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::Hosts;

    fn tree(n: usize, rank: usize, root: usize) -> Tree {
        let hosts = Hosts::flat(n);
        let p = Params {
            nranks: n,
            rank,
            count: 1,
            root,
            channels: 1,
            chunk: 1,
            in_place: false,
            around: false,
            hosts: &hosts,
        };
        Tree::new(&p)
    }

    #[test]
    fn subtrees_cover_every_rank_once() {
        for n in 1..=64 {
            for root in [0, n / 2, n - 1] {
                // every rank but the root has one parent, whose subtree holds its own
                let mut seen = vec![0; n];
                for r in 0..n {
                    let t = tree(n, r, root);
                    for c in t.children() {
                        seen[t.abs(c)] += 1;
                        assert!(c + t.size(c) <= t.v + t.size(t.v), "n={n} root={root} v={}", t.v);
                    }
                    let cut: usize = t.segments(t.v).iter().map(|s| s.len()).sum();
                    assert_eq!(cut, t.size(t.v));
                }
                seen[root] += 1;
                assert!(seen.iter().all(|&s| s == 1), "n={n} root={root}: {seen:?}");
            }
        }
    }

    #[test]
    fn the_root_takes_log_many_messages() {
        assert_eq!(tree(64, 5, 5).children().len(), 6);
        assert_eq!(tree(5, 0, 0).children(), vec![1, 2, 4]);
        assert_eq!(tree(5, 3, 0).children(), Vec::<usize>::new());
    }
}
