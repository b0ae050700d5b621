//! Recursive doubling and recursive halving-doubling (Rabenseifner), with
//! the fold that handles rank counts that are not powers of two.
//!
//! ```text
//!  fold (n = 6, p2 = 4, rem = 2):   0→1   2→3   4   5        even extras hand their data to the
//!                                     1     3   4   5        odd neighbour and wait
//!  doubling over p2 "new ranks":    [1  3  4  5]             distance 1, 2, ... : exchange with
//!                                    ╰─╯  ╰─╯   then ╰────╯  new rank ^ distance
//!  unfold:                          1→0   3→2                results go back to the extras
//! ```

use super::part::{exchange, recv_pieces, reg, send_pieces, split, Into};
use super::schedule::{Buf, Region, Schedule, Step};
use super::Params;
use std::ops::Range;

/// A range `lo..hi` of new ranks.
pub type Span = (usize, usize);

/// One exchange: the peer's new rank, then two ranges of new ranks (kept
/// and given away when halving; ours and the peer's when doubling).
pub type Exchange = (usize, Span, Span);

/// Rank roles when folding `n` ranks onto the largest power of two `p2 ≤ n`.
#[derive(Clone, Copy, Debug)]
pub struct Fold {
    /// Ranks taking part in the doubling.
    pub p2: usize,
    /// `n - p2`: ranks `0..2*rem` pair up, the even one of each pair sits out.
    pub rem: usize,
}

impl Fold {
    /// The fold of `n` ranks.
    pub fn new(n: usize) -> Self {
        let p2 = if n == 0 { 1 } else { 1usize << (usize::BITS - 1 - n.leading_zeros()) };
        Fold { p2, rem: n.saturating_sub(p2) }
    }
    /// `Some(new rank)` for a participant, `None` for an extra that sits out.
    pub fn newrank(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.rem)
        }
    }
    /// The participant holding new rank `j`.
    pub fn rank_of(&self, j: usize) -> usize {
        if j < self.rem {
            2 * j + 1
        } else {
            j + self.rem
        }
    }
    /// Recursive halving for new rank `me`, distance p2/2 down to 1: per
    /// step the peer's new rank, the half of new ranks `me` keeps and the
    /// half it gives away (`lo..hi` pairs); the last kept half is `me..me+1`.
    pub fn halving(&self, me: usize) -> Vec<Exchange> {
        let (mut lo, mut hi, mut mask, mut steps) = (0, self.p2, self.p2 / 2, Vec::new());
        while mask > 0 {
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if me & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
            steps.push((me ^ mask, keep, give));
            (lo, hi) = keep;
            mask /= 2;
        }
        steps
    }

    /// Recursive doubling for new rank `me`, distance 1 up to p2/2: per step
    /// the peer's new rank, the aligned range of new ranks `me` holds and
    /// the one the peer holds; the two together are held after the step.
    pub fn doubling(&self, me: usize) -> Vec<Exchange> {
        let (mut mask, mut steps) = (1, Vec::new());
        while mask < self.p2 {
            let (mine, theirs) = (me & !(mask - 1), (me ^ mask) & !(mask - 1));
            steps.push((me ^ mask, (mine, mine + mask), (theirs, theirs + mask)));
            mask <<= 1;
        }
        steps
    }

    /// First original rank whose data new rank `j` holds (`first(p2) = n`):
    /// new ranks `a..b` hold the data of ranks `first(a)..first(b)`.
    pub fn first(&self, j: usize) -> usize {
        if j < self.rem {
            2 * j
        } else {
            j + self.rem
        }
    }
}

/// The element ranges of blocks `b0..b1` (each `count` long) restricted to
/// the channel's sub-range `sub` of every block: one range when the
/// channel covers whole blocks, one per block otherwise.
fn block_ranges(b0: usize, b1: usize, count: usize, sub: &Range<usize>) -> Vec<Range<usize>> {
    if sub.start == 0 && sub.end == count {
        std::iter::once(b0 * count..b1 * count).collect()
    } else {
        (b0..b1).map(|b| b * count + sub.start..b * count + sub.end).collect()
    }
}

fn regions(buf: Buf, rs: &[Range<usize>]) -> Vec<Region> {
    rs.iter().map(|r| reg(buf, r)).collect()
}

/// Folds extras in (their data reduced into their partner's `Output`), or
/// copies the input for ranks with no extra. Returns our new rank.
fn fold_in(ch: &mut Vec<Step>, f: &Fold, rank: usize, range: &Range<usize>, chunk: usize) -> Option<usize> {
    let nr = f.newrank(rank);
    match nr {
        None => send_pieces(ch, rank + 1, reg(Buf::Input, range), chunk),
        Some(_) if rank < 2 * f.rem => {
            exchange(ch, rank - 1, &[], &[reg(Buf::Input, range)], chunk, Into::ReduceTo(Buf::Output));
        }
        Some(_) => ch.push(Step::Copy { src: reg(Buf::Input, range), dst: reg(Buf::Output, range) }),
    }
    nr
}

/// As [`fold_in`], except that a rank with no extra copies nothing: its
/// first exchange reads `Input` and reduces into `Output` instead, saving a
/// pass over the data (the second value says so; the caller copies if it
/// makes no exchange at all).
fn fold_in_direct(
    ch: &mut Vec<Step>,
    f: &Fold,
    rank: usize,
    range: &Range<usize>,
    chunk: usize,
) -> (Option<usize>, bool) {
    match f.newrank(rank) {
        Some(nr) if rank >= 2 * f.rem => (Some(nr), true),
        _ => (fold_in(ch, f, rank, range, chunk), false),
    }
}

/// The buffer an exchange reads: `Input` while nothing has reached `Output`
/// yet, then `Output`; and how received data is combined.
fn source(direct: bool) -> (Buf, Into) {
    if direct {
        (Buf::Input, Into::ReduceTo(Buf::Output))
    } else {
        (Buf::Output, Into::Reduce)
    }
}

/// Hands the finished `Output` range back to the extras.
fn fold_out(ch: &mut Vec<Step>, f: &Fold, rank: usize, range: &Range<usize>, chunk: usize) {
    if rank < 2 * f.rem {
        if rank % 2 == 1 {
            send_pieces(ch, rank - 1, reg(Buf::Output, range), chunk);
        } else {
            recv_pieces(ch, rank + 1, reg(Buf::Output, range), chunk);
        }
    }
}

/// All-reduce by recursive doubling: log2(p2) exchanges of the whole vector.
pub fn all_reduce_rd(p: &Params) -> Schedule {
    let f = Fold::new(p.nranks);
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|range| {
            let mut ch = Vec::new();
            let (me, mut direct) = fold_in_direct(&mut ch, &f, p.rank, range, p.chunk);
            if let Some(me) = me {
                // distance 1, 2, 4, ...: exchange everything with new rank ^ distance
                for (peer, _, _) in f.doubling(me) {
                    let (buf, into) = source(direct);
                    let all = [reg(buf, range)];
                    exchange(&mut ch, f.rank_of(peer), &all, &all, p.chunk, into);
                    direct = false;
                }
            }
            if direct {
                ch.push(Step::Copy { src: reg(Buf::Input, range), dst: reg(Buf::Output, range) });
            }
            fold_out(&mut ch, &f, p.rank, range, p.chunk);
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// All-reduce by recursive halving (a reduce-scatter over `p2` blocks)
/// then recursive doubling (an all-gather), Rabenseifner's algorithm.
pub fn all_reduce_rhd(p: &Params) -> Schedule {
    let f = Fold::new(p.nranks);
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|range| {
            let mut ch = Vec::new();
            let (me, mut direct) = fold_in_direct(&mut ch, &f, p.rank, range, p.chunk);
            if let Some(me) = me {
                let blocks = split(range.clone(), f.p2);
                let span = |a: usize, b: usize| blocks[a].start..blocks[b - 1].end;
                // halving: distance p2/2, ..., 1; give away the half the peer keeps
                for (peer, keep, give) in f.halving(me) {
                    let (buf, into) = source(direct);
                    let send = [reg(buf, &span(give.0, give.1))];
                    let recv = [reg(buf, &span(keep.0, keep.1))];
                    exchange(&mut ch, f.rank_of(peer), &send, &recv, p.chunk, into);
                    direct = false;
                }
                // doubling: distance 1, ..., p2/2: swap finished ranges, doubling them
                for (peer, mine, theirs) in f.doubling(me) {
                    let send = [reg(Buf::Output, &span(mine.0, mine.1))];
                    let recv = [reg(Buf::Output, &span(theirs.0, theirs.1))];
                    exchange(&mut ch, f.rank_of(peer), &send, &recv, p.chunk, Into::Copy);
                }
            }
            if direct {
                ch.push(Step::Copy { src: reg(Buf::Input, range), dst: reg(Buf::Output, range) });
            }
            fold_out(&mut ch, &f, p.rank, range, p.chunk);
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// All-gather by recursive doubling: the gathered range doubles each step.
pub fn all_gather_rd(p: &Params) -> Schedule {
    let f = Fold::new(p.nranks);
    let (n, count, r) = (p.nranks, p.count, p.rank);
    let channels = split(0..count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            let own_in = reg(Buf::Input, sub);
            let own_out = Region::new(Buf::Output, r * count + sub.start, sub.len());
            let all = regions(Buf::Output, &block_ranges(0, n, count, sub));
            match f.newrank(r) {
                None => {
                    // an extra: hand our block to the partner, get everything back at the end
                    send_pieces(&mut ch, r + 1, own_in, p.chunk);
                    exchange(&mut ch, r + 1, &[], &all, p.chunk, Into::Copy);
                }
                Some(me) => {
                    ch.push(Step::Copy { src: own_in, dst: own_out });
                    if r < 2 * f.rem {
                        let theirs = Region::new(Buf::Output, (r - 1) * count + sub.start, sub.len());
                        recv_pieces(&mut ch, r - 1, theirs, p.chunk);
                    }
                    for (peer, mine, theirs) in f.doubling(me) {
                        let held = |(a, b): Span| block_ranges(f.first(a), f.first(b), count, sub);
                        let (send, recv) = (regions(Buf::Output, &held(mine)), regions(Buf::Output, &held(theirs)));
                        exchange(&mut ch, f.rank_of(peer), &send, &recv, p.chunk, Into::Copy);
                    }
                    if r < 2 * f.rem {
                        exchange(&mut ch, r - 1, &all, &[], p.chunk, Into::Copy);
                    }
                }
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// Reduce-scatter by recursive halving: each step sends away the half of
/// the (partially reduced) vector that the peer's side keeps. Works in a
/// scratch copy of the whole input.
pub fn reduce_scatter_rh(p: &Params) -> Schedule {
    let f = Fold::new(p.nranks);
    let (n, count, r) = (p.nranks, p.count, p.rank);
    let channels = split(0..count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            let blocks = |a: usize, b: usize, buf: Buf| regions(buf, &block_ranges(a, b, count, sub));
            let own_out = Region::new(Buf::Output, sub.start, sub.len());
            match f.newrank(r) {
                None => {
                    // an extra: hand everything to the partner, get our block back
                    exchange(&mut ch, r + 1, &blocks(0, n, Buf::Input), &[], p.chunk, Into::Copy);
                    recv_pieces(&mut ch, r + 1, own_out, p.chunk);
                }
                Some(me) => {
                    let mut cur = Buf::Input;
                    if r < 2 * f.rem {
                        // fold: the extra's whole vector plus ours, into scratch
                        let all = blocks(0, n, Buf::Input);
                        exchange(&mut ch, r - 1, &[], &all, p.chunk, Into::ReduceTo(Buf::Scratch));
                        cur = Buf::Scratch;
                    }
                    // halving over new ranks lo..hi, keeping the half that holds `me`;
                    // received data reduces with `cur` into scratch at the same offsets
                    for (peer, keep, give) in f.halving(me) {
                        let send = blocks(f.first(give.0), f.first(give.1), cur);
                        let recv = blocks(f.first(keep.0), f.first(keep.1), cur);
                        exchange(&mut ch, f.rank_of(peer), &send, &recv, p.chunk, Into::ReduceTo(Buf::Scratch));
                        cur = Buf::Scratch;
                    }
                    // our block to the output; the extra's block back to it
                    let mine = Region::new(cur, r * count + sub.start, sub.len());
                    ch.push(Step::Copy { src: mine, dst: own_out });
                    if r < 2 * f.rem {
                        let theirs = Region::new(cur, (r - 1) * count + sub.start, sub.len());
                        send_pieces(&mut ch, r - 1, theirs, p.chunk);
                    }
                }
            }
            ch
        })
        .collect();
    let scratch = if p.nranks > 1 { n * count } else { 0 };
    Schedule { channels, scratch }
}
