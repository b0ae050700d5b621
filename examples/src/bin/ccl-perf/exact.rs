//! The data of the float-sum sweeps of the other backends (`--backend mpi`,
//! `--backend nccl`) and what their results must be: small integers, so
//! every sum is exact in any order.

use super::Coll;

/// Rank `r`'s element `i`.
pub fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 13) % 11) as f32
}

/// Elements of rank `r`'s output `out` of `coll` (a sum over `n` ranks of
/// [`value`]s, `count` elements per rank's block, root `root`) that differ
/// from the exact result.
pub fn wrong(coll: Coll, (n, r, root): (usize, usize, usize), count: usize, out: &[f32]) -> u64 {
    // the sum over ranks 0..k
    let sum = |k: usize, q: usize| (0..k).map(|s| value(s, q)).sum::<f32>();
    let fold = |q: usize| sum(n, q);
    let c = count.max(1);
    let want = |q: usize| -> Option<f32> {
        Some(match coll.base() {
            Coll::AllReduce => fold(q),
            Coll::Reduce if r == root => fold(q),
            Coll::Reduce => return None,
            Coll::Broadcast => value(root, q),
            Coll::AllGather => value(q / c, q % c),
            Coll::ReduceScatter => fold(r * count + q),
            Coll::AllToAll => value(q / c, r * count + q % c),
            Coll::Gather if r == root => value(q / c, q % c),
            Coll::Gather => return None,
            Coll::Scatter => value(root, r * count + q),
            Coll::Scan => sum(r + 1, q),
            Coll::Exscan if r == 0 => return None,
            Coll::Exscan => sum(r, q),
            Coll::SendRecv => value(super::neighbour(r, -1, n), q),
            Coll::Halo => value(super::neighbour(r, -super::halo_dirs(n)[q / c], n), q),
            // (never a base: the varying forms are their base's)
            _ => return None,
        })
    };
    out.iter().enumerate().filter(|(q, x)| want(*q).is_some_and(|w| w != **x)).count() as u64
}
