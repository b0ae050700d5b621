//! Hierarchical all-reduce, given the ranks of each host.
//!
//! ```text
//!  ring-ring (L ranks per host):             tree-ring:
//!   host A: a0 a1 a2   reduce-scatter          host A: a1 a2 ─▶ a0 (reduce up a tree)
//!   host B: b0 b1 b2   inside each host         a0 ◀──▶ b0 ◀──▶ c0 (ring across leaders)
//!   a_j ◀──▶ b_j       ring all-reduce of       a0 ─▶ a1 a2 (broadcast down the tree)
//!                      block j across hosts
//!   all-gather inside each host
//! ```
//! With unequal hosts, ring-ring splits the vector over the smallest host's
//! rank count; ranks beyond it on larger hosts hold empty blocks.

use super::part::{npieces, piece, reg, split};
use super::ring::{all_gather_ring, all_reduce_round, reduce_scatter_ring};
use super::schedule::{Buf, Schedule, Step};
use super::tree::{down, rank_tree, up};
use super::Params;
use std::ops::Range;

/// Our host's index, our place on it, and the groups.
fn place<'a>(p: &Params<'a>) -> (&'a [Vec<usize>], usize, usize) {
    (p.hosts.groups(), p.hosts.host_of(p.rank), p.hosts.local(p.rank))
}

/// Ring all-reduce of `range` (in `buf`, in place) over `ring`.
fn cross_ring(ch: &mut Vec<Step>, ring: &[usize], pos: usize, range: &Range<usize>, chunk: usize) {
    let n = ring.len();
    if n == 1 {
        return;
    }
    for k in 0..npieces(range.len(), n * chunk) {
        let round = piece(range, n * chunk, k);
        all_reduce_round(ch, ring, pos, &split(round, n), Buf::Output, Buf::Output);
    }
}

/// Reduce-scatter inside each host, ring all-reduce across hosts, all-gather inside.
pub fn all_reduce_ring_ring(p: &Params) -> Schedule {
    let (groups, h, local) = place(p);
    let lmin = groups.iter().map(Vec::len).min().unwrap_or(1);
    let mine = &groups[h];
    let channels = split(0..p.count, p.channels)
        .into_iter()
        .map(|range| {
            let mut ch = Vec::new();
            let mut blocks = split(range.clone(), lmin);
            blocks.resize(mine.len(), range.end..range.end);
            // phase 1: local position j ends with block j summed over the host
            reduce_scatter_ring(&mut ch, mine, local, &blocks, p.chunk, Buf::Input, &|r| reg(Buf::Output, r));
            // phase 2: block j summed across hosts by the j-th rank of each host
            if local < lmin {
                let cross: Vec<usize> = groups.iter().map(|g| g[local]).collect();
                cross_ring(&mut ch, &cross, h, &blocks[local], p.chunk);
            }
            // phase 3: every rank of the host gathers all blocks
            all_gather_ring(&mut ch, mine, local, &blocks, p.chunk, &|r| reg(Buf::Output, r), Buf::Output);
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}

/// Reduce up a tree inside each host to its first rank, ring all-reduce
/// across those leaders, broadcast down the tree.
pub fn all_reduce_tree_ring(p: &Params) -> Schedule {
    let (groups, h, local) = place(p);
    let t = rank_tree(&groups[h], p.rank);
    let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
    let channels = split(0..p.count, p.channels)
        .into_iter()
        .map(|range| {
            let mut ch = Vec::new();
            up(&mut ch, &t, &range, p.chunk, Buf::Input, Buf::Output);
            if local == 0 {
                cross_ring(&mut ch, &leaders, h, &range, p.chunk);
            }
            down(&mut ch, &t, &range, p.chunk, Buf::Output, Buf::Output);
            ch
        })
        .collect();
    Schedule { channels, scratch: 0 }
}
