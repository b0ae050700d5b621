//! Ring algorithms: all-reduce, reduce-scatter, all-gather, and the
//! pipelined chains for broadcast and reduce.
//!
//! ```text
//!   pos 0 ──▶ pos 1 ──▶ pos 2 ──▶ ... ──▶ pos n-1 ──┐
//!     ▲                                             │
//!     └─────────────────────────────────────────────┘
//! ```
//! Data always flows to the next ring position. The ring order comes from
//! the topology (each host entered and left once).

use super::part::{npieces, piece, reg, reg_at, split, split_nth};
use super::schedule::{Buf, Region, Schedule, Step};
use super::Params;
use std::ops::Range;

/// Neighbours of ring position `pos`: (previous rank, next rank).
fn neighbours(ring: &[usize], pos: usize) -> (usize, usize) {
    let n = ring.len();
    (ring[(pos + n - 1) % n], ring[(pos + 1) % n])
}

/// One round of ring all-reduce over `parts` (one part per ring position),
/// reading `src` and leaving the result in `dst` on every rank.
pub fn all_reduce_round(ch: &mut Vec<Step>, ring: &[usize], pos: usize, parts: &[Range<usize>], src: Buf, dst: Buf) {
    let n = ring.len();
    if n == 1 {
        ch.push(Step::Copy { src: reg(src, &parts[0]), dst: reg(dst, &parts[0]) });
        return;
    }
    let (prev, next) = neighbours(ring, pos);
    let part = |k: usize| &parts[k % n];
    // step 0: send our own part
    ch.push(Step::Send { to: next, src: reg(src, part(pos)) });
    // steps 1..n-2: add ours to the partial sum arriving and pass it on
    for s in 1..n - 1 {
        let p = part(pos + n - s);
        ch.push(Step::RecvReduceSend { from: prev, to: next, src: reg(src, p) });
    }
    // step n-1: the part is complete here: keep it and start the all-gather
    let p = part(pos + 1);
    ch.push(Step::RecvReduceCopySend { from: prev, to: next, src: reg(src, p), dst: reg(dst, p) });
    // steps n..2n-3: pass completed parts on
    for s in 1..n - 1 {
        let p = part(pos + 1 + n - s);
        ch.push(Step::RecvCopySend { from: prev, to: next, dst: reg(dst, p) });
    }
    // step 2n-2: the last completed part
    ch.push(Step::Recv { from: prev, dst: reg(dst, part(pos + 2)) });
}

/// Ring reduce-scatter: `blocks[q]` (in `src` coordinates) is the block ring
/// position `q` ends with; `out` places our finished pieces.
pub fn reduce_scatter_ring(
    ch: &mut Vec<Step>,
    ring: &[usize],
    pos: usize,
    blocks: &[Range<usize>],
    chunk: usize,
    src: Buf,
    out: &dyn Fn(&Range<usize>) -> Region,
) {
    let n = ring.len();
    let rounds = blocks.iter().map(|b| npieces(b.len(), chunk)).max().unwrap_or(1);
    let (prev, next) = neighbours(ring, pos);
    for k in 0..rounds {
        let p = |q: usize| piece(&blocks[q % n], chunk, k);
        if n == 1 {
            ch.push(Step::Copy { src: reg(src, &p(0)), dst: out(&p(0)) });
            continue;
        }
        // step 0: our contribution to the block of the previous position
        ch.push(Step::Send { to: next, src: reg(src, &p(pos + n - 1)) });
        // steps 1..n-2: add ours and pass on
        for s in 1..n - 1 {
            ch.push(Step::RecvReduceSend { from: prev, to: next, src: reg(src, &p(pos + n - 1 - s)) });
        }
        // step n-1: our own block arrives with everyone else's contribution
        ch.push(Step::RecvReduce { from: prev, src: reg(src, &p(pos)), dst: out(&p(pos)) });
    }
}

/// Ring all-gather: `blocks[q]` (in `dst` coordinates) is the block ring
/// position `q` contributes; `own` locates our contribution's pieces.
pub fn all_gather_ring(
    ch: &mut Vec<Step>,
    ring: &[usize],
    pos: usize,
    blocks: &[Range<usize>],
    chunk: usize,
    own: &dyn Fn(&Range<usize>) -> Region,
    dst: Buf,
) {
    let n = ring.len();
    let rounds = blocks.iter().map(|b| npieces(b.len(), chunk)).max().unwrap_or(1);
    let (prev, next) = neighbours(ring, pos);
    for k in 0..rounds {
        let p = |q: usize| piece(&blocks[q % n], chunk, k);
        let mine = p(pos);
        // step 0: place our block and send it on
        let placed = reg(dst, &mine);
        if own(&mine) != placed {
            ch.push(Step::Copy { src: own(&mine), dst: placed });
        }
        if n == 1 {
            continue;
        }
        ch.push(Step::Send { to: next, src: own(&mine) });
        // steps 1..n-2: keep and forward
        for s in 1..n - 1 {
            ch.push(Step::RecvCopySend { from: prev, to: next, dst: reg(dst, &p(pos + n - s)) });
        }
        // step n-1: the block of the next position, which has gone all the way round
        ch.push(Step::Recv { from: prev, dst: reg(dst, &p(pos + 1)) });
    }
}

/// Channel `c`'s ring and the rank's position in it
/// ([`Hosts::channel_ring`](crate::topo::Hosts::channel_ring)).
fn ring_of(p: &Params, c: usize) -> (Vec<usize>, usize) {
    (p.hosts.channel_ring(c), p.hosts.channel_ring_pos(p.rank, c))
}

/// All-reduce by ring: per channel, rounds of `n × chunk` elements.
pub fn all_reduce(p: &Params) -> Schedule {
    let n = p.nranks;
    let channels = split(0..p.count, p.channels)
        .into_iter()
        .enumerate()
        .map(|(c, range)| {
            let (ring, pos) = ring_of(p, c);
            let mut ch = Vec::new();
            for k in 0..npieces(range.len(), n * p.chunk) {
                let round = piece(&range, n * p.chunk, k);
                all_reduce_round(&mut ch, &ring, pos, &split(round, n), Buf::Input, Buf::Output);
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// Per channel: part `c` of each rank's block, by ring position.
fn channel_blocks(p: &Params, ring: &[usize], c: usize) -> Vec<Range<usize>> {
    ring.iter().map(|&r| split_nth(p.block(r), p.channels, c)).collect()
}

/// Reduce-scatter by ring: input `n × count`, rank `r` keeps block `r`
/// (or the blocks of [`Params::blocks`]).
pub fn reduce_scatter(p: &Params) -> Schedule {
    let base = p.block(p.rank).start;
    let channels = (0..p.channels)
        .map(|c| {
            let (ring, pos) = ring_of(p, c);
            let mut ch = Vec::new();
            let blocks = channel_blocks(p, &ring, c);
            reduce_scatter_ring(&mut ch, &ring, pos, &blocks, p.chunk, Buf::Input, &|r| reg_at(Buf::Output, r, base));
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// All-gather by ring: input `count`, output `n × count` in rank order (or
/// the blocks of [`Params::blocks`]).
pub fn all_gather(p: &Params) -> Schedule {
    let base = p.block(p.rank).start;
    let channels = (0..p.channels)
        .map(|c| {
            let (ring, pos) = ring_of(p, c);
            let mut ch = Vec::new();
            let blocks = channel_blocks(p, &ring, c);
            all_gather_ring(&mut ch, &ring, pos, &blocks, p.chunk, &|r| reg_at(Buf::Input, r, base), Buf::Output);
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// The ring rotated so that the root comes first (its `i`-th rank), its
/// length and our place in it.
fn chain_from_root<'a>(p: &Params<'a>) -> (impl Fn(usize) -> usize + 'a, usize, usize) {
    let (ring, pos) = (p.hosts.ring(), p.hosts.ring_pos(p.rank));
    let n = ring.len();
    let rpos = p.hosts.ring_pos(p.root);
    (move |i: usize| ring[(rpos + i) % n], n, (pos + n - rpos) % n)
}

/// Broadcast down a pipelined chain that starts at the root.
pub fn broadcast(p: &Params) -> Schedule {
    let (chain, n, me) = chain_from_root(p);
    let channels = split(0..p.count, p.channels)
        .into_iter()
        .map(|range| {
            let mut ch = Vec::new();
            for k in 0..npieces(range.len(), p.chunk) {
                let c = piece(&range, p.chunk, k);
                if me == 0 {
                    ch.push(Step::Copy { src: reg(Buf::Input, &c), dst: reg(Buf::Output, &c) });
                    if n > 1 {
                        ch.push(Step::Send { to: chain(1), src: reg(Buf::Input, &c) });
                    }
                } else if me + 1 < n {
                    ch.push(Step::RecvCopySend { from: chain(me - 1), to: chain(me + 1), dst: reg(Buf::Output, &c) });
                } else {
                    ch.push(Step::Recv { from: chain(me - 1), dst: reg(Buf::Output, &c) });
                }
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// Reduce up a pipelined chain that ends at the root.
pub fn reduce(p: &Params) -> Schedule {
    let (from_root, n, me_from_root) = chain_from_root(p);
    // chain(0) = the rank after the root, ..., chain(n-1) = the root
    let chain = |i: usize| from_root((i + 1) % n);
    let me = (me_from_root + n - 1) % n;
    let channels = split(0..p.count, p.channels)
        .into_iter()
        .map(|range| {
            let mut ch = Vec::new();
            for k in 0..npieces(range.len(), p.chunk) {
                let c = piece(&range, p.chunk, k);
                let src = reg(Buf::Input, &c);
                if n == 1 {
                    ch.push(Step::Copy { src, dst: reg(Buf::Output, &c) });
                } else if me == 0 {
                    ch.push(Step::Send { to: chain(1), src });
                } else if me + 1 < n {
                    ch.push(Step::RecvReduceSend { from: chain(me - 1), to: chain(me + 1), src });
                } else {
                    ch.push(Step::RecvReduce { from: chain(me - 1), src, dst: reg(Buf::Output, &c) });
                }
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}
