//! Schedules on shared buffers: where every rank of a host maps every
//! other's buffers (`alloc_shared`), each rank reads its peers' inputs and
//! writes their outputs itself, with no slots in between (NCCL's
//! registered buffers, in one collective call).
//!
//! A rank owns a share of the elements ([`split`]): in an all-reduce it
//! reduces its share from every rank's input and writes the result into
//! every rank's output, a block at a time so that the copies read it from
//! the cache; in a reduce-scatter it reduces its own block; in an
//! all-gather it writes its block into every output; in a broadcast (in
//! place) it copies its share of the root's buffer to the others. No two
//! ranks write the same memory, and none reads what another writes.
//!
//! A fence of notices before and after orders the call against what each
//! rank does to its own buffers outside it: no rank reads a buffer before
//! its owner has entered the call, and none returns before every other has
//! finished with its buffers. The notices go through the connections like
//! every message, so deadlines, lost peers and mismatched calls fail as
//! they do there.

use super::part::split;
use super::schedule::{Buf, Region, Schedule, Step};
use super::{Coll, Params};

/// A dissemination fence: in round `i` tell rank `r + 2^i` and wait for
/// rank `r - 2^i`; after ⌈log2 n⌉ rounds every rank's steps before the
/// fence happen before every rank's steps after it.
fn fence(ch: &mut Vec<Step>, n: usize, r: usize) {
    let mut d = 1;
    while d < n {
        ch.push(Step::Notify { to: (r + d) % n });
        ch.push(Step::Wait { from: (r + n - d) % n });
        d *= 2;
    }
}

/// This rank first, then the others in order.
fn me_first(n: usize, me: usize) -> impl Iterator<Item = usize> + Clone {
    std::iter::once(me).chain((0..n).filter(move |&r| r != me))
}

/// The schedule of `coll` on shared buffers, in blocks of `p.chunk`
/// elements: all-reduce, reduce-scatter, all-gather (in place or not) and
/// broadcast in place.
pub fn schedule(coll: Coll, p: &Params) -> Result<Schedule, String> {
    let (n, me, count) = (p.nranks, p.rank, p.count);
    // (ranks of one host: fewer than 2^32)
    let own = |r: usize, off: usize, len: usize| Region::new(Buf::PeerOutput(r as u32), off, len);
    let inp = |r: usize, off: usize, len: usize| Region::new(Buf::PeerInput(r as u32), off, len);
    let mut ch = Vec::new();
    fence(&mut ch, n, me);
    let mut scratch = 0;
    match coll {
        Coll::AllReduce | Coll::ReduceScatter => {
            // the elements this rank reduces, where they lie in every input,
            // and where the result goes in each output, by rank
            let (from, mine, dests): (usize, _, Vec<(usize, usize)>) = match coll {
                Coll::AllReduce => {
                    let s = split(0..count, n).swap_remove(me);
                    (s.start, s.len(), me_first(n, me).map(|r| (r, s.start)).collect())
                }
                _ => (me * count, count, vec![(me, if p.in_place { me * count } else { 0 })]),
            };
            // into this rank's own output, and from there to the others'
            // (through the cache: it is read back); but where the output
            // goes around the cache and is read back (copied to other
            // ranks, or reduced into more than once), into a block of
            // scratch that stays in the cache, and from there to each
            let src = |r: usize, off: usize, len: usize| if p.in_place { own(r, off, len) } else { inp(r, off, len) };
            let read_back = dests.len() > 1 || n > 2;
            let into_output = p.in_place || !(p.around && read_back);
            let block = p.chunk.max(1);
            let mut at = 0;
            while at < mine {
                let l = block.min(mine - at);
                let tmp = if into_output {
                    if !p.in_place {
                        ch.push(Step::Copy { src: src(me, from + at, l), dst: own(me, dests[0].1 + at, l) });
                    }
                    own(me, dests[0].1 + at, l)
                } else {
                    scratch = scratch.max(l);
                    ch.push(Step::Copy { src: src(me, from + at, l), dst: Region::new(Buf::Scratch, 0, l) });
                    Region::new(Buf::Scratch, 0, l)
                };
                for r in (0..n).filter(|&r| r != me) {
                    ch.push(Step::Reduce { src: src(r, from + at, l), dst: tmp });
                }
                for &(r, to) in &dests {
                    if tmp != own(r, to + at, l) {
                        ch.push(Step::Copy { src: tmp, dst: own(r, to + at, l) });
                    }
                }
                at += l;
            }
        }
        Coll::AllGather => {
            let mine = if p.in_place { own(me, me * count, count) } else { inp(me, 0, count) };
            for r in me_first(n, me) {
                if own(r, me * count, count) != mine {
                    ch.push(Step::Copy { src: mine, dst: own(r, me * count, count) });
                }
            }
        }
        Coll::Broadcast if p.in_place => {
            let s = split(0..count, n).swap_remove(me);
            for r in (0..n).filter(|&r| r != p.root) {
                ch.push(Step::Copy { src: own(p.root, s.start, s.len()), dst: own(r, s.start, s.len()) });
            }
        }
        _ => return Err(format!("{coll}{} does not run on shared buffers", if p.in_place { " in place" } else { "" })),
    }
    fence(&mut ch, n, me);
    Ok(Schedule { channels: vec![ch], scratch })
}
