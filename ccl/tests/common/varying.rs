//! The calls whose counts vary by rank, for one type and operator: every
//! form of each, blocking, in place and non-blocking, on counts drawn
//! afresh (zeros among them, blocks in rank order or not, with gaps or
//! not), checked against a reference built block by block.

use super::{compare, input, reference, Elem};
use ccl::{Counts, Group, ReduceOp};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Counts of about `count` elements per rank (a quarter of them 0), the
/// same on every rank (drawn from the call's seed): packed, or in a
/// random order with gaps of up to 2 elements between the blocks.
pub fn draw_counts(rng: &mut StdRng, n: usize, count: usize) -> Counts {
    let counts: Vec<usize> =
        (0..n).map(|_| if rng.gen_ratio(1, 4) { 0 } else { rng.gen_range(0..=2 * count) }).collect();
    if rng.gen() {
        return Counts::new(&counts).expect("counts");
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(rng);
    let (mut displs, mut at) = (vec![0; n], 0);
    for r in order {
        at += rng.gen_range(0..=2);
        displs[r] = at;
        at += counts[r];
    }
    Counts::with_displs(&counts, &displs).expect("counts")
}

/// `blocks` of `from` (by rank, from the buffer of all blocks) placed as
/// `counts` says in a buffer of `fill` (the elements between blocks).
fn placed<T: Elem>(counts: &Counts, blocks: &[&[T]], fill: T) -> Vec<T> {
    let mut out = vec![fill; counts.extent()];
    for (r, b) in blocks.iter().enumerate() {
        out[counts.block(r)].copy_from_slice(b);
    }
    out
}

/// Every varying call for `T` and `O` on `g`, call number `c`.
pub fn calls<T: Elem, O: ReduceOp<T>>(g: &Group, seed: u64, c: u64, count: usize, small: bool) -> Result<(), String> {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    let err = |e: ccl::Error| e.to_string();
    let mut rng = StdRng::seed_from_u64(seed ^ c.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let counts = draw_counts(&mut rng, n, count);
    let what = |s: &str| format!("{s}<{}, {}> counts {counts:?}", T::NAME, O::NAME);
    let zero = T::zeroed();

    // all_gatherv and gatherv: rank k's block is its own input
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, counts.count(k), small)).collect();
    let refs: Vec<&[T]> = ins.iter().map(Vec::as_slice).collect();
    let all = placed(&counts, &refs, zero);
    let mut out = vec![zero; counts.extent()];
    comm.all_gatherv(&ins[r], &mut out, &counts).map_err(err)?;
    compare(&what("all_gatherv"), &out, &all, n)?;
    let mut buf = vec![zero; counts.extent()];
    buf[counts.block(r)].copy_from_slice(&ins[r]);
    comm.all_gatherv_in_place(&mut buf, &counts).map_err(err)?;
    compare(&what("all_gatherv_in_place"), &buf, &all, n)?;
    let got = comm.iall_gatherv(ins[r].clone(), &counts).wait().map_err(err)?;
    compare(&what("iall_gatherv"), &got, &all, n)?;
    let root = (c as usize) % n;
    let at_root = |v: &[T]| if r == root { v.to_vec() } else { Vec::new() };
    let mut out = vec![zero; if r == root { counts.extent() } else { 0 }];
    comm.gatherv(&ins[r], &mut out, &counts, root).map_err(err)?;
    compare(&what("gatherv"), &out, &at_root(&all), n)?;
    let got = comm.igatherv(ins[r].clone(), &counts, root).wait().map_err(err)?;
    compare(&what("igatherv"), &got, &at_root(&all), n)?;

    // scatterv: the root's buffer of all blocks, rank k gets block k
    let whole: Vec<T> = input(seed, c + 1, root, counts.extent(), small);
    let mine = &whole[counts.block(r)];
    let mut out = vec![zero; counts.count(r)];
    comm.scatterv(&at_root(&whole), &mut out, &counts, root).map_err(err)?;
    compare(&what("scatterv"), &out, mine, n)?;
    let got = comm.iscatterv(at_root(&whole), &counts, root).wait().map_err(err)?;
    compare(&what("iscatterv"), &got, mine, n)?;

    // reduce_scatterv: rank k gets block k of the reduction
    let sums: Vec<Vec<T>> = (0..n).map(|k| input(seed, c + 2, k, counts.extent(), small)).collect();
    let want = reference::<T, O>(&sums);
    let mine = &want[counts.block(r)];
    let mut out = vec![zero; counts.count(r)];
    comm.reduce_scatterv(&sums[r], &mut out, &counts, O::default()).map_err(err)?;
    compare(&what("reduce_scatterv"), &out, mine, n)?;
    let got = comm.ireduce_scatterv(sums[r].clone(), &counts, O::default()).wait().map_err(err)?;
    compare(&what("ireduce_scatterv"), &got, mine, n)?;

    // all_to_allv: every rank draws every rank's counts, from the same seed
    let per_rank: Vec<(Counts, Counts)> = {
        let m: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| rng.gen_range(0..=count)).collect()).collect();
        (0..n)
            .map(|k| {
                let sends = Counts::new(&m[k]).expect("counts");
                let from: Vec<usize> = (0..n).map(|s| m[s][k]).collect();
                let gaps: Vec<usize> = (0..n).map(|s| 2 * s + from[..s].iter().sum::<usize>()).collect();
                (sends, Counts::with_displs(&from, &gaps).expect("counts"))
            })
            .collect()
    };
    let sent: Vec<Vec<T>> = (0..n).map(|k| input(seed, c + 3, k, per_rank[k].0.extent(), small)).collect();
    let (sends, recvs) = &per_rank[r];
    let blocks: Vec<&[T]> = (0..n).map(|s| &sent[s][per_rank[s].0.block(r)]).collect();
    let want = placed(recvs, &blocks, zero);
    let mut out = vec![zero; recvs.extent()];
    comm.all_to_allv(&sent[r], sends, &mut out, recvs).map_err(err)?;
    compare(&what("all_to_allv"), &out, &want, n)?;
    let got = comm.iall_to_allv(sent[r].clone(), sends, recvs).wait().map_err(err)?;
    compare(&what("iall_to_allv"), &got, &want, n)
}
