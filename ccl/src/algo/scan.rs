//! Prefix reductions: `scan` (rank `r` ends with the reduction of ranks
//! `0..=r`) and `exscan` (of ranks `0..r`; rank 0's output is left as it
//! was, as MPI leaves it undefined).
//!
//! Two forms: a chain `0 → 1 → … → n-1` that passes each piece's running
//! prefix on as it reduces it (n - 1 hops, then one piece per step: the
//! form for large calls), and recursive doubling (⌈log2 n⌉ exchanges of
//! the whole vector: the form for small ones, as MPICH's).

use super::part::{exchange, npieces, piece, reg, split, Into};
use super::schedule::{Buf, Region, Schedule, Step};
use super::{Coll, Params};

/// The chain: rank `r` takes the prefix of ranks `0..r` from `r - 1`
/// piece by piece, and passes it on with its own input reduced in.
pub fn chain(coll: Coll, p: &Params) -> Schedule {
    let (n, r) = (p.nranks, p.rank);
    let ex = coll == Coll::Exscan;
    let (prev, next) = ((r > 0).then(|| r - 1), (r + 1 < n).then_some(r + 1));
    let channels = split(0..p.count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            for k in 0..npieces(sub.len(), p.chunk) {
                let piece = piece(sub, p.chunk, k);
                let (input, output) = (reg(Buf::Input, &piece), reg(Buf::Output, &piece));
                match (prev, next, ex) {
                    (None, None, false) => ch.push(Step::Copy { src: input, dst: output }),
                    (None, None, true) => {}
                    (None, Some(to), true) => ch.push(Step::Send { to, src: input }),
                    (None, Some(to), false) => {
                        ch.push(Step::Copy { src: input, dst: output });
                        ch.push(Step::Send { to, src: output });
                    }
                    (Some(from), None, false) => ch.push(Step::RecvReduce { from, src: input, dst: output }),
                    (Some(from), Some(to), false) => {
                        ch.push(Step::RecvReduceCopySend { from, to, src: input, dst: output })
                    }
                    (Some(from), None, true) => ch.push(Step::Recv { from, dst: output }),
                    (Some(from), Some(to), true) => {
                        // keep the prefix, pass it on with our input reduced
                        // in (in one pass with the copy; in place, the input
                        // is saved first, as the prefix lands on it)
                        let sum = reg(Buf::Scratch, &piece);
                        let save = Step::Copy { src: input, dst: sum };
                        if p.in_place {
                            ch.push(save);
                        }
                        ch.push(Step::Recv { from, dst: output });
                        if !p.in_place {
                            ch.push(save);
                        }
                        ch.push(Step::Reduce { src: output, dst: sum });
                        ch.push(Step::Send { to, src: sum });
                    }
                }
            }
            ch
        })
        .collect();
    let scratch = if ex && prev.is_some() && next.is_some() { p.count } else { 0 };
    Schedule { channels, scratch }
}

/// Recursive doubling: at level `m` (1, 2, 4, …) rank `r` swaps with
/// `r ^ m` the reduction of its block of `m` ranks; what comes from below
/// joins its prefix, and all of it its block's total for the next level.
/// Ranks past `n` are skipped, so any `n` works; a rank takes nothing it
/// will not use (from above at its last level), and its peer sends it
/// nothing then.
pub fn doubling(coll: Coll, p: &Params) -> Schedule {
    let (n, r, count) = (p.nranks, p.rank, p.count);
    let ex = coll == Coll::Exscan;
    let levels: Vec<usize> = (0..usize::BITS).map(|b| 1usize << b).take_while(|&m| m < n).collect();
    // whether rank `x` has a peer at any level after the `i`-th
    let more = |x: usize, i: usize| levels[i + 1..].iter().any(|&m| x ^ m < n);
    // whether rank `x` uses what its peer at level `i` sends
    let takes = |x: usize, i: usize| x ^ levels[i] < x || more(x, i);
    let channels = split(0..count, p.channels)
        .iter()
        .map(|sub| {
            let mut ch = Vec::new();
            let at = |buf: Buf, base: usize| Region::new(buf, base + sub.start, sub.len());
            let (input, output) = (at(Buf::Input, 0), at(Buf::Output, 0));
            let (total, came) = (at(Buf::Scratch, 0), at(Buf::Scratch, count));
            if !ex {
                ch.push(Step::Copy { src: input, dst: output });
            }
            // where this rank's block total lies: its input until it takes more
            let mut sum = input;
            let mut have = !ex;
            for (i, &m) in levels.iter().enumerate() {
                let peer = r ^ m;
                if peer >= n {
                    continue;
                }
                let (send, take, last) = (takes(peer, i), takes(r, i), !more(r, i));
                // an exscan's only prefix may land in place, where nothing else reads it
                let into = if peer < r && !have && last && !p.in_place { output } else { came };
                let (send, take) = (if send { vec![sum] } else { vec![] }, if take { vec![into] } else { vec![] });
                exchange(&mut ch, peer, &send, &take, p.chunk, Into::Copy);
                if take.is_empty() {
                    continue;
                }
                // the total first: in place, the input is the output
                if !last {
                    if sum == input {
                        ch.push(Step::Copy { src: input, dst: total });
                        sum = total;
                    }
                    ch.push(Step::Reduce { src: came, dst: total });
                }
                if peer < r && into == came {
                    ch.push(if have { Step::Reduce { src: came, dst: output } } else { Step::Copy { src: came, dst: output } });
                }
                have |= peer < r;
            }
            ch
        })
        .collect();
    Schedule { channels, scratch: 2 * count }
}
