//! Partitions of element ranges: balanced splits and pipeline pieces.

use super::schedule::{Buf, Region, Step};
use std::ops::Range;

/// Splits `r` into `parts` contiguous ranges whose lengths differ by at most
/// one (the first `len % parts` are one longer).
pub fn split(r: Range<usize>, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let len = r.end - r.start;
    let (base, extra) = (len / parts, len % parts);
    let mut out = Vec::with_capacity(parts);
    let mut start = r.start;
    for i in 0..parts {
        let l = base + usize::from(i < extra);
        out.push(start..start + l);
        start += l;
    }
    out
}

/// Part `i` of [`split`]`(r, parts)`, without the others.
pub fn split_nth(r: Range<usize>, parts: usize, i: usize) -> Range<usize> {
    let parts = parts.max(1);
    let len = r.end - r.start;
    let (base, extra) = (len / parts, len % parts);
    let start = r.start + i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// The `k`-th pipeline piece of `r` when cut every `chunk` elements; empty
/// past the end.
pub fn piece(r: &Range<usize>, chunk: usize, k: usize) -> Range<usize> {
    let s = (r.start + k * chunk).min(r.end);
    let e = (s + chunk).min(r.end);
    s..e
}

/// How many pieces of `chunk` elements cover `len` (at least one).
pub fn npieces(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk.max(1)).max(1)
}

/// A region of `buf` over `r`.
pub fn reg(buf: Buf, r: &Range<usize>) -> Region {
    Region::new(buf, r.start, r.end - r.start)
}

/// A region of `buf` over `r` shifted down by `base` (a range given in one
/// buffer's coordinates, placed in a smaller buffer that starts at `base`).
pub fn reg_at(buf: Buf, r: &Range<usize>, base: usize) -> Region {
    Region::new(buf, r.start - base, r.end - r.start)
}

/// What a receive does with arriving data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Into {
    /// Store it in the receive region.
    Copy,
    /// Reduce it into the receive region.
    Reduce,
    /// Reduce it with the receive region, storing the result at the same
    /// offsets of another buffer.
    ReduceTo(Buf),
}

/// Sends `send` to `peer` and receives `recv` from it, piece by piece,
/// alternating, so that two ranks exchanging with each other never hold
/// more than one piece in flight each way.
pub fn exchange(ch: &mut Vec<Step>, peer: usize, send: &[Region], recv: &[Region], chunk: usize, into: Into) {
    let cut = |rs: &[Region]| -> Vec<Region> {
        rs.iter()
            .flat_map(|r| {
                let range = r.off..r.end();
                (0..npieces(r.len, chunk)).map(move |k| reg(r.buf, &piece(&range, chunk, k)))
            })
            .collect()
    };
    let (s, r) = (cut(send), cut(recv));
    for i in 0..s.len().max(r.len()) {
        if let Some(&src) = s.get(i) {
            ch.push(Step::Send { to: peer, src });
        }
        if let Some(&dst) = r.get(i) {
            ch.push(match into {
                Into::Copy => Step::Recv { from: peer, dst },
                Into::Reduce => Step::RecvReduce { from: peer, src: dst, dst },
                Into::ReduceTo(buf) => Step::RecvReduce { from: peer, src: dst, dst: Region { buf, ..dst } },
            });
        }
    }
}

/// Pushes `src` to `peer` in pieces.
pub fn send_pieces(ch: &mut Vec<Step>, to: usize, src: Region, chunk: usize) {
    exchange(ch, to, &[src], &[], chunk, Into::Copy);
}

/// Receives `dst` from `peer` in pieces.
pub fn recv_pieces(ch: &mut Vec<Step>, from: usize, dst: Region, chunk: usize) {
    exchange(ch, from, &[], &[dst], chunk, Into::Copy);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_balanced_and_covers() {
        for len in 0..40 {
            for parts in 1..10 {
                let s = split(5..5 + len, parts);
                assert_eq!(s.len(), parts);
                assert_eq!(s[0].start, 5);
                assert_eq!(s[parts - 1].end, 5 + len);
                for w in s.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                for (i, part) in s.iter().enumerate() {
                    assert_eq!(split_nth(5..5 + len, parts, i), *part);
                }
                let lens: Vec<_> = s.iter().map(|r| r.len()).collect();
                assert!(lens.iter().max().unwrap_or(&0) - lens.iter().min().unwrap_or(&0) <= 1);
            }
        }
    }

    #[test]
    fn pieces_cover_in_order() {
        let r = 3..20;
        let n = npieces(r.len(), 5);
        assert_eq!(n, 4);
        let ps: Vec<_> = (0..n).map(|k| piece(&r, 5, k)).collect();
        assert_eq!(ps, vec![3..8, 8..13, 13..18, 18..20]);
        assert!(piece(&r, 5, 9).is_empty());
    }
}
