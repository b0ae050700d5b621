//! Direct patterns: pairwise all-to-all, dissemination barrier, and
//! point-to-point send and receive.

use super::part::{npieces, piece, recv_pieces, reg, send_pieces, split_nth};
use super::schedule::{Buf, Region, Schedule, Step};
use super::Params;

/// All-to-all by pairwise exchange: at step `k` send block `r+k` to rank
/// `r+k` and receive block `r-k` from rank `r-k`. In place, the input is
/// first copied to scratch so no block is overwritten before it is sent.
/// With [`Params::blocks`], the blocks sent and received are the call's.
pub fn all_to_all(p: &Params) -> Schedule {
    let (n, count, r) = (p.nranks, p.count, p.rank);
    let src = if p.in_place { Buf::Scratch } else { Buf::Input };
    let channels = (0..p.channels)
        .map(|c| {
            let mut ch = Vec::new();
            let part = |b: std::ops::Range<usize>| split_nth(b, p.channels, c);
            let (sent, got) = (|b: usize| part(p.block(b)), |b: usize| part(p.recv_block(b)));
            if p.in_place {
                for b in 0..n {
                    let s = sent(b);
                    ch.push(Step::Copy { src: reg(Buf::Input, &s), dst: reg(Buf::Scratch, &s) });
                }
            }
            // step 0: our own block
            ch.push(Step::Copy { src: reg(src, &sent(r)), dst: reg(Buf::Output, &got(r)) });
            // steps 1..n-1: to r+k, from r-k, a piece at a time
            for k in 1..n {
                let (to, from) = ((r + k) % n, (r + n - k) % n);
                let (s, d) = (sent(to), got(from));
                for i in 0..npieces(s.len(), p.chunk).max(npieces(d.len(), p.chunk)) {
                    ch.push(Step::Send { to, src: reg(src, &piece(&s, p.chunk, i)) });
                    ch.push(Step::Recv { from, dst: reg(Buf::Output, &piece(&d, p.chunk, i)) });
                }
            }
            ch
        })
        .collect();
    let scratch = if p.in_place { n * count } else { 0 };
    Schedule { channels, scratch }
}

/// Barrier by dissemination: in round `i` tell rank `r + 2^i` and hear from
/// rank `r - 2^i`; after ⌈log2 n⌉ rounds every rank has heard, directly or
/// not, from every other. Runs on one byte of scratch (its value is unused).
pub fn barrier(p: &Params) -> Schedule {
    let (n, r) = (p.nranks, p.rank);
    let token = Region::new(Buf::Scratch, 0, 1);
    let mut ch = Vec::new();
    let mut d = 1;
    while d < n {
        ch.push(Step::Send { to: (r + d) % n, src: token });
        ch.push(Step::RecvReduce { from: (r + n - d) % n, src: token, dst: token });
        d *= 2;
    }
    Schedule { channels: vec![ch], scratch: 1 }
}

/// Point-to-point send of the whole input to `p.root` (the peer).
pub fn send(p: &Params) -> Schedule {
    let mut ch = Vec::new();
    send_pieces(&mut ch, p.root, reg(Buf::Input, &(0..p.count)), p.chunk);
    Schedule { channels: vec![ch], scratch: 0 }
}

/// Point-to-point receive of the whole output from `p.root` (the peer).
pub fn recv(p: &Params) -> Schedule {
    let mut ch = Vec::new();
    recv_pieces(&mut ch, p.root, reg(Buf::Output, &(0..p.count)), p.chunk);
    Schedule { channels: vec![ch], scratch: 0 }
}
