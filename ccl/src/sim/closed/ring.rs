//! The closed form of rings and of recursive halving-doubling: a ring's
//! stage and its all-reduce's rounds, and halving-doubling's levels
//! around the fold.

use super::*;

/// The most of `c` channels whose rings cross between hosts of `s` ranks
/// through one of `nics` links: channel `ch` leaves a host from local rank
/// `ch - 1` and enters the next at local rank `ch` (modulo `s`,
/// `Hosts::channel_ring`), each rank using link `local % nics`.
pub(super) fn rail_crowd(c: f64, s: usize, nics: usize) -> f64 {
    let (c, s, nics) = (c.max(1.0) as usize, s.max(1), nics.max(1));
    let mut on = vec![0usize; nics];
    for ch in 0..c {
        on[(ch % s) % nics] += 1;
    }
    on.into_iter().max().unwrap_or(1) as f64
}

/// The stage a ring moves at, over `steps` steps in a row: as busy as
/// its slowest hop, across hosts where it crosses them (`share` transfers,
/// of its channels and others, on the busiest link), and as long to reach
/// the next rank as its hops on average along the slowest path of `steps`
/// hops (which crosses hosts `ceil(steps · hosts / n)` times: once per
/// host it passes, and once more where it starts just before a crossing).
pub(super) fn ring_stage(r: &Rates, kind: Kind, b: f64, (n, hosts): (usize, usize), (c, share): (f64, f64), steps: f64) -> Stage {
    if hosts < 2 {
        return r.hop(kind, b, false, 1.0, c);
    }
    // between GPUs a rank's own link inside the host carries what its
    // channels take from its host's ranks: not the rings that enter the
    // host at it (as many at each rank, `c / p` of them, where the
    // channels go round the host's ranks whole)
    let entering = if r.m.streams { (c / (n / hosts).max(1) as f64).floor() } else { 0.0 };
    let intra = r.hop(kind, b, false, 1.0, (c - entering).max(1.0));
    let across = r.hop(kind, b, true, share, c);
    let steps = steps.max(1.0);
    let f = (steps * hosts as f64 / n as f64).ceil().min(steps) / steps;
    let mix = |a: f64, b: f64| a * (1.0 - f) + b * f;
    Stage {
        latency: mix(intra.latency, across.latency),
        each: intra.each.max(across.each),
        first: mix(intra.first, across.first),
        wake: intra.wake,
    }
}

/// A ring all-reduce of `s_ch` bytes per channel over `n` ranks on
/// `hosts` hosts, in rounds of `n` pieces: reduce-scatter then all-gather
/// steps; the channels cross hosts on links of their own where they can
/// ([`rail_crowd`]), and `crowd` rings of a host share each.
pub(super) fn ring_all_reduce(r: &Rates, (n, hosts): (usize, usize), s_ch: f64, chunk: usize, c: f64, crowd: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let (rounds, b) = r.pieces(s_ch / n as f64, chunk);
    let steps = rounds * (n - 1) as f64;
    // (the reduce-scatter's and the all-gather's steps in a row)
    let share = rail_crowd(c, n / hosts.max(1), r.m.nics) * crowd;
    let stage = |kind| ring_stage(r, kind, b, (n, hosts), (c, share), 2.0 * steps);
    // each round starts with a piece copied into a slot (its last step,
    // a piece copied out, is the all-gather's: the reduce-scatter's last
    // step copies out only what it has just reduced, from the cache)
    let ends = rounds * r.work(Kind::Copy, b) * r.serial;
    ring_steps(stage(Kind::ReduceSend), steps) + ring_steps(stage(Kind::CopySend), steps) + ends
}

/// Recursive halving (reduce-scatter), doubling (all-gather), or both
/// (all-reduce): at level `k` a rank exchanges `s / 2^k` bytes of the
/// all-reduce's vector, or the blocks that new ranks `p2 / 2^k` apart
/// hold, each of which the fold gave two (the first `rem`).
pub(super) fn halving_doubling(coll: Coll, r: &Rates, s_ch: f64, chunk: usize, c: f64) -> f64 {
    let n = r.n;
    let nics = r.m.nics.max(1) as f64;
    let levels = r.doubling().len();
    // the whole vector (all-gather and reduce-scatter count per rank)
    let whole = match coll {
        Coll::AllReduce => s_ch,
        _ => s_ch * n as f64,
    };
    let Fold { p2, rem } = r.fold;
    let mut t = 0.0;
    let phase = |kind: Kind| {
        let mut t = 0.0;
        for k in 1..=levels {
            // halving from the whole, new ranks p2 / 2^k apart
            let d = p2 >> k;
            let b = match coll {
                Coll::AllReduce => whole / (1u64 << k) as f64,
                _ => s_ch * (d + d.min(rem)) as f64,
            };
            let (inter, ranks) = r.doubling()[levels - k];
            let crowd = if inter { c * (ranks / nics).max(1.0) } else { 1.0 };
            // (on several channels a channel holds a slice of every rank's
            // block, and moves each slice in pieces of its own; a block of
            // one element stays whole, on one channel)
            let split = coll != Coll::AllReduce && c > 1.0 && s_ch * c >= 2.0 * r.elem;
            let blocks = if split { (b / s_ch).round().max(1.0) } else { 1.0 };
            let (q, piece) = r.pieces(b / blocks, chunk);
            let q = q * blocks;
            // an exchange sends a piece and takes its peer's before it sends
            // the next (one piece in flight each way): across hosts each
            // pays the network's latency; inside one, as far as sending its
            // own piece does not hide it
            t += q * r.exchange(kind, piece, inter, crowd, c);
        }
        t
    };
    if matches!(coll, Coll::AllReduce | Coll::ReduceScatter) {
        t += phase(Kind::Exchange);
    }
    if matches!(coll, Coll::AllReduce | Coll::AllGather) {
        t += phase(Kind::ExchangeCopy);
    }
    // an extra rank's data in: all of it, or (all-gather) its block; the
    // result out: all of it, or (reduce-scatter) its block
    let folded = match coll {
        Coll::AllGather => r.fold(s_ch, whole, chunk, c, 1),
        Coll::ReduceScatter => r.fold(whole, s_ch, chunk, c, 1),
        _ => r.fold(whole, whole, chunk, c, 2),
    };
    // an all-gather first copies its own block into the output, a
    // reduce-scatter last copies its reduced block there
    let own = if coll == Coll::AllReduce { 0.0 } else { r.work(Kind::Copy, s_ch) * r.serial };
    t + folded + own
}
