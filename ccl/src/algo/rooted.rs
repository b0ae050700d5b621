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

use super::part::{exchange, reg, split_nth, Into};
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
    let (n, r, root) = (p.nranks, p.rank, p.root);
    // the root's buffer of all blocks, and every rank's own one
    let (all, own) = if to_root { (Buf::Output, Buf::Input) } else { (Buf::Input, Buf::Output) };
    let channels = (0..p.channels)
        .map(|c| {
            let mut ch = Vec::new();
            let part = |q: usize| split_nth(p.block(q), p.channels, c);
            let mine = {
                let (b, at) = (part(r), p.block(r).start);
                Region::new(own, b.start - at, b.len())
            };
            let block = |q: usize| reg(all, &part(q));
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
struct Tree<'a> {
    n: usize,
    root: usize,
    /// This rank, relative to the root.
    v: usize,
    p: Params<'a>,
    /// With variable blocks: where the blocks of relative ranks `v + 1..`
    /// of this rank's subtree start in its scratch, and one past the last.
    offs: Vec<usize>,
}

impl<'a> Tree<'a> {
    fn new(p: &Params<'a>) -> Self {
        let v = (p.rank + p.nranks - p.root) % p.nranks;
        let mut t = Tree { n: p.nranks, root: p.root, v, p: *p, offs: Vec::new() };
        if v != 0 && p.blocks.is_some() {
            let mut at = 0;
            t.offs.push(0);
            for u in v + 1..v + t.size(v) {
                at += p.block(t.abs(u)).len();
                t.offs.push(at);
            }
        }
        t
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
    /// channel `c`'s part of them: the root in `whole` (the user's n
    /// blocks), another rank its own block in `own` and the others in
    /// scratch, one after the other. One region per block, or, with equal
    /// blocks, one for them all where the channel holds whole blocks.
    fn place(&self, seg: &Range<usize>, c: usize, whole: Buf, own: Buf) -> Vec<Region> {
        let part = |b: Range<usize>| split_nth(b, self.p.channels, c);
        if self.p.blocks.is_some() {
            let at = |u: usize| {
                let b = self.p.block(self.abs(u));
                if self.v == 0 {
                    reg(whole, &part(b))
                } else if u == self.v {
                    reg(own, &part(0..b.len()))
                } else {
                    let o = self.offs[u - self.v - 1];
                    reg(Buf::Scratch, &part(o..o + b.len()))
                }
            };
            return seg.clone().map(at).collect();
        }
        let (buf, first) = if self.v == 0 {
            (whole, self.abs(seg.start))
        } else if seg.start == self.v {
            (own, 0)
        } else {
            (Buf::Scratch, seg.start - self.v - 1)
        };
        let count = self.p.count;
        let sub = part(0..count);
        if sub.len() == count {
            return vec![Region::new(buf, first * count, seg.len() * count)];
        }
        (0..seg.len()).map(|i| Region::new(buf, (first + i) * count + sub.start, sub.len())).collect()
    }

    /// Elements of scratch: the subtree's blocks but this rank's own.
    fn scratch(&self) -> usize {
        if self.v == 0 {
            0
        } else if self.p.blocks.is_some() {
            self.offs.last().copied().unwrap_or(0)
        } else {
            (self.size(self.v) - 1) * self.p.count
        }
    }
}

/// Gather along a binomial tree: each rank takes its children's subtrees,
/// nearest first, and passes its own subtree up.
pub fn gather_tree(p: &Params) -> Schedule {
    let t = Tree::new(p);
    let channels = (0..p.channels)
        .map(|c| {
            let mut ch = Vec::new();
            if t.v == 0 {
                let b = p.block(p.rank);
                let (src, dst) = (split_nth(0..b.len(), p.channels, c), split_nth(b, p.channels, c));
                ch.push(Step::Copy { src: reg(Buf::Input, &src), dst: reg(Buf::Output, &dst) });
            }
            for child in t.children() {
                for seg in t.segments(child) {
                    let dst = t.place(&seg, c, Buf::Output, Buf::Input);
                    exchange(&mut ch, t.abs(child), &[], &dst, p.chunk, Into::Copy);
                }
            }
            if t.v != 0 {
                for seg in t.segments(t.v) {
                    let src = t.place(&seg, c, Buf::Output, Buf::Input);
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
    let channels = (0..p.channels)
        .map(|c| {
            let mut ch = Vec::new();
            if t.v == 0 {
                let b = p.block(p.rank);
                let (src, dst) = (split_nth(b.clone(), p.channels, c), split_nth(0..b.len(), p.channels, c));
                ch.push(Step::Copy { src: reg(Buf::Input, &src), dst: reg(Buf::Output, &dst) });
            } else {
                for seg in t.segments(t.v) {
                    let dst = t.place(&seg, c, Buf::Input, Buf::Output);
                    exchange(&mut ch, t.parent(), &[], &dst, p.chunk, Into::Copy);
                }
            }
            for child in t.children().into_iter().rev() {
                for seg in t.segments(child) {
                    let src = t.place(&seg, c, Buf::Input, Buf::Output);
                    exchange(&mut ch, t.abs(child), &src, &[], p.chunk, Into::Copy);
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

    fn tree(n: usize, rank: usize, root: usize) -> Tree<'static> {
        let hosts = Box::leak(Box::new(Hosts::flat(n)));
        let p = Params {
            nranks: n,
            rank,
            count: 1,
            root,
            channels: 1,
            chunk: 1,
            in_place: false,
            around: false,
            hosts,
            blocks: None,
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
