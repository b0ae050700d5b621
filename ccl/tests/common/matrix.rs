//! The collective matrix every rank runs: all collectives × 15 type and
//! operator pairs × several counts, checked against a sequential
//! reference. Shared by the thread tests (ccl/tests/collectives.rs) and
//! the process tests (integration/, through cclrun).

use super::{compare, input, reference, Elem};
use ccl::{Avg, BitXor, Group, Max, Min, Prod, Reduce, ReduceOp, Sum};
use half::{bf16, f16};
use rand::rngs::StdRng;

#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
pub struct Moments {
    pub n: u64,
    pub sum: f64,
    #[reduce(max)]
    pub peak: f32,
}

impl Elem for Moments {
    fn draw(rng: &mut StdRng, small: bool) -> Self {
        Moments { n: u64::draw(rng, true), sum: f64::draw(rng, small), peak: f32::draw(rng, false) }
    }
    fn close(a: Self, b: Self, n: usize) -> bool {
        a.n == b.n && f64::close(a.sum, b.sum, n) && a.peak == b.peak
    }
}

/// Counts every call is made with.
pub const COUNTS: [usize; 4] = [0, 1, 13, 700];

/// A check's outcome: what differed, if anything.
pub type Check = Result<(), String>;

fn err(e: ccl::Error) -> String {
    e.to_string()
}

/// The reducing collectives for one type and operator.
fn reductions<T: Elem, O: ReduceOp<T>>(g: &Group, seed: u64, call: &mut u64, count: usize, small: bool) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    let mut next = || {
        *call += 1;
        *call
    };
    let what = |s: &str| format!("{s}<{}, {}> count {count}", T::NAME, O::NAME);

    let c = next();
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, count, small)).collect();
    let want = reference::<T, O>(&ins);
    let mut buf = ins[r].clone();
    comm.all_reduce(&mut buf, O::default()).map_err(err)?;
    compare(&what("all_reduce"), &buf, &want, n)?;
    let mut out = vec![T::zeroed(); count];
    comm.all_reduce_into(&ins[r], &mut out, O::default()).map_err(err)?;
    compare(&what("all_reduce_into"), &out, &want, n)?;
    let got = comm.iall_reduce(ins[r].clone(), O::default()).wait().map_err(err)?;
    compare(&what("iall_reduce"), &got, &want, n)?;

    let root = (c as usize) % n;
    let mut buf = ins[r].clone();
    comm.reduce(&mut buf, O::default(), root).map_err(err)?;
    compare(&what("reduce"), &buf, if r == root { &want } else { &ins[r] }, n)?;
    let mut out = vec![T::zeroed(); if r == root { count } else { 0 }];
    comm.reduce_into(&ins[r], &mut out, O::default(), root).map_err(err)?;
    if r == root {
        compare(&what("reduce_into"), &out, &want, n)?;
    }

    let c = next();
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, n * count, small)).collect();
    let want = reference::<T, O>(&ins);
    let mine = &want[r * count..(r + 1) * count];
    let mut out = vec![T::zeroed(); count];
    comm.reduce_scatter(&ins[r], &mut out, O::default()).map_err(err)?;
    compare(&what("reduce_scatter"), &out, mine, n)?;
    let mut buf = ins[r].clone();
    comm.reduce_scatter_in_place(&mut buf, O::default()).map_err(err)?;
    compare(&what("reduce_scatter_in_place"), &buf[r * count..(r + 1) * count], mine, n)?;
    let got = comm.ireduce_scatter(ins[r].clone(), O::default()).wait().map_err(err)?;
    compare(&what("ireduce_scatter"), &got, mine, n)?;
    scans::<T, O>(g, seed, next(), count, small)?;
    super::varying::calls::<T, O>(g, seed, next(), count, small)
}

/// Scan and exscan, in place, into another buffer and non-blocking: rank
/// `r` against the reduction of ranks `0..=r` (`0..r`; rank 0's left as
/// it was).
fn scans<T: Elem, O: ReduceOp<T>>(g: &Group, seed: u64, c: u64, count: usize, small: bool) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    let what = |s: &str| format!("{s}<{}, {}> count {count}", T::NAME, O::NAME);
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, count, small)).collect();
    let upto = reference::<T, O>(&ins[..=r]);
    let mut buf = ins[r].clone();
    comm.scan(&mut buf, O::default()).map_err(err)?;
    compare(&what("scan"), &buf, &upto, r + 1)?;
    let mut out = vec![T::zeroed(); count];
    comm.scan_into(&ins[r], &mut out, O::default()).map_err(err)?;
    compare(&what("scan_into"), &out, &upto, r + 1)?;
    let got = comm.iscan(ins[r].clone(), O::default()).wait().map_err(err)?;
    compare(&what("iscan"), &got, &upto, r + 1)?;
    // rank 0 keeps what it had: its input in place, the marker elsewhere
    let (before, marker) = if r == 0 {
        (ins[0].clone(), ins[(n > 1) as usize].clone())
    } else {
        (reference::<T, O>(&ins[..r]), ins[r].clone())
    };
    let mut buf = ins[r].clone();
    comm.exscan(&mut buf, O::default()).map_err(err)?;
    compare(&what("exscan"), &buf, &before, r.max(1))?;
    let mut out = marker.clone();
    comm.exscan_into(&ins[r], &mut out, O::default()).map_err(err)?;
    compare(&what("exscan_into"), &out, if r == 0 { &marker } else { &before }, r.max(1))?;
    let got = comm.iexscan(ins[r].clone(), O::default()).wait().map_err(err)?;
    compare(&what("iexscan"), &got, &before, r.max(1))
}

/// Broadcast, gathers, scatter, all-to-all and point-to-point for one type.
fn movements<T: Elem>(g: &Group, seed: u64, call: &mut u64, count: usize) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    *call += 1;
    let c = *call;
    let what = |s: &str| format!("{s}<{}> count {count}", T::NAME);
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, count, false)).collect();

    let root = (c as usize + 1) % n;
    let mut buf = if r == root { ins[r].clone() } else { vec![T::zeroed(); count] };
    comm.broadcast(&mut buf, root).map_err(err)?;
    compare(&what("broadcast"), &buf, &ins[root], n)?;
    let mut out = vec![T::zeroed(); count];
    let send = if r == root { ins[r].clone() } else { Vec::new() };
    comm.broadcast_into(&send, &mut out, root).map_err(err)?;
    compare(&what("broadcast_into"), &out, &ins[root], n)?;
    let got = comm.ibroadcast(buf.clone(), root).wait().map_err(err)?;
    compare(&what("ibroadcast"), &got, &ins[root], n)?;

    let all: Vec<T> = ins.concat();
    let mut out = vec![T::zeroed(); n * count];
    comm.all_gather(&ins[r], &mut out).map_err(err)?;
    compare(&what("all_gather"), &out, &all, n)?;
    let mut buf = vec![T::zeroed(); n * count];
    buf[r * count..(r + 1) * count].copy_from_slice(&ins[r]);
    comm.all_gather_in_place(&mut buf).map_err(err)?;
    compare(&what("all_gather_in_place"), &buf, &all, n)?;
    let got = comm.iall_gather(ins[r].clone()).wait().map_err(err)?;
    compare(&what("iall_gather"), &got, &all, n)?;

    // gather and scatter, to and from another root
    let root = (c as usize + 2) % n;
    let mut out = vec![T::zeroed(); if r == root { n * count } else { 0 }];
    comm.gather(&ins[r], &mut out, root).map_err(err)?;
    let at_root = |v: &[T]| if r == root { v.to_vec() } else { Vec::new() };
    compare(&what("gather"), &out, &at_root(&all), n)?;
    let mut buf = if r == root { vec![T::zeroed(); n * count] } else { ins[r].clone() };
    if r == root {
        buf[r * count..(r + 1) * count].copy_from_slice(&ins[r]);
    }
    comm.gather_in_place(&mut buf, root).map_err(err)?;
    compare(&what("gather_in_place"), &buf, if r == root { &all } else { &ins[r] }, n)?;
    let got = comm.igather(ins[r].clone(), root).wait().map_err(err)?;
    compare(&what("igather"), &got, &at_root(&all), n)?;
    let mine = &all[r * count..(r + 1) * count];
    let mut out = vec![T::zeroed(); count];
    comm.scatter(&at_root(&all), &mut out, root).map_err(err)?;
    compare(&what("scatter"), &out, mine, n)?;
    let mut buf = if r == root { all.clone() } else { vec![T::zeroed(); count] };
    comm.scatter_in_place(&mut buf, root).map_err(err)?;
    compare(&what("scatter_in_place"), if r == root { &buf[r * count..(r + 1) * count] } else { &buf }, mine, n)?;
    let got = comm.iscatter(at_root(&all), vec![T::zeroed(); count], root).wait().map_err(err)?;
    compare(&what("iscatter"), &got, mine, n)?;

    // all-to-all: rank s sends block d of its input to rank d
    let a2a: Vec<Vec<T>> = (0..n).map(|k| input(seed, c + 1_000_000, k, n * count, false)).collect();
    let want: Vec<T> = (0..n).flat_map(|s| a2a[s][r * count..(r + 1) * count].to_vec()).collect();
    let mut out = vec![T::zeroed(); n * count];
    comm.all_to_all(&a2a[r], &mut out).map_err(err)?;
    compare(&what("all_to_all"), &out, &want, n)?;
    let mut buf = a2a[r].clone();
    comm.all_to_all_in_place(&mut buf).map_err(err)?;
    compare(&what("all_to_all_in_place"), &buf, &want, n)?;
    let got = comm.iall_to_all(a2a[r].clone()).wait().map_err(err)?;
    compare(&what("iall_to_all"), &got, &want, n)?;

    // point to point around the ring: send right, receive from the left
    if n > 1 {
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let req = comm.isend(ins[r].clone(), right);
        let mut got = vec![T::zeroed(); count];
        comm.recv(&mut got, left).map_err(err)?;
        req.wait().map_err(err)?;
        compare(&what("send/recv"), &got, &ins[left], n)?;
        if r.is_multiple_of(2) {
            comm.send(&ins[r], right).map_err(err)?;
            let got = comm.irecv(vec![T::zeroed(); count], left).wait().map_err(err)?;
            compare(&what("isend/irecv"), &got, &ins[left], n)?;
        } else {
            let got = comm.irecv(vec![T::zeroed(); count], left).wait().map_err(err)?;
            comm.send(&ins[r], right).map_err(err)?;
            compare(&what("isend/irecv"), &got, &ins[left], n)?;
        }
        let mut got = vec![T::zeroed(); count];
        comm.sendrecv(&ins[r], right, &mut got, left).map_err(err)?;
        compare(&what("sendrecv"), &got, &ins[left], n)?;
        // both ways round the ring in one group, odd ranks posting the other way round
        let (mut from_left, mut from_right) = (vec![T::zeroed(); count], vec![T::zeroed(); count]);
        let (fl, fr) = (&mut from_left, &mut from_right);
        comm.grouped(|grp| {
            if r % 2 == 1 {
                grp.recv(fr, right)?;
                grp.send(&ins[r], left)?;
                grp.send(&ins[r], right)?;
                grp.recv(fl, left)
            } else {
                grp.send(&ins[r], right)?;
                grp.recv(fl, left)?;
                grp.send(&ins[r], left)?;
                grp.recv(fr, right)
            }
        })
        .map_err(err)?;
        if n > 2 {
            compare(&what("grouped from the left"), &from_left, &ins[left], n)?;
            compare(&what("grouped from the right"), &from_right, &ins[right], n)?;
        }
    }
    g.barrier().map_err(err)?;
    g.ibarrier().wait().map_err(err)
}

/// Elements of the large calls ([`large`]): a few MiB, not a multiple of
/// anything, so every step spans several slots and ends in a partial one.
pub const LARGE: usize = (3 << 18) + 5;

/// Large calls, in place and not, each spanning many slots: where a
/// transport sends straight from the call's buffers, what it sends must
/// not be written over before it has gone (the process tests over TCP).
pub fn large(g: &Group, seed: u64) -> Check {
    let mut call = 1 << 20;
    reductions::<f32, Sum>(g, seed, &mut call, LARGE, true)?;
    reductions::<i32, Prod>(g, seed, &mut call, LARGE, true)?;
    registered::<f32, Sum>(g, seed, &mut call, LARGE)?;
    movements::<f32>(g, seed, &mut call, LARGE)
}

/// Calls on buffers registered with the group's RDMA devices (sent
/// straight from them over RDMA, as they are elsewhere), twice, so that
/// the second reuses the registration. Over the software provider with
/// shared memory off, every rank's buffers must be registered.
fn registered<T: Elem, O: ReduceOp<T>>(g: &Group, seed: u64, call: &mut u64, count: usize) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    *call += 1;
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, *call, k, n * count, true)).collect();
    let want = reference::<T, O>(&ins);
    let mine = r * count..(r + 1) * count;
    let root = *call as usize % n;
    let what = |s: &str| format!("{s}<{}, {}> on registered buffers, count {count}", T::NAME, O::NAME);
    let (mut a, mut b, mut c) = (ins[r].clone(), vec![T::zeroed(); n * count], vec![T::zeroed(); count]);
    let mut a = comm.register(&mut a).map_err(err)?;
    let mut b = comm.register(&mut b).map_err(err)?;
    let mut c = comm.register(&mut c).map_err(err)?;
    let env = |k: &str| std::env::var(k).as_deref() == Ok("1");
    if n > 1 && env("CCL_IB_SOFT") && env("CCL_SHM_DISABLE") && !(a.is_registered() && c.is_registered()) {
        return Err(what("registration: none over RDMA"));
    }
    for _ in 0..2 {
        a.copy_from_slice(&ins[r]);
        comm.all_reduce_into(&a, &mut b, O::default()).map_err(err)?;
        compare(&what("all_reduce_into"), &b, &want, n)?;
        comm.all_reduce(&mut a, O::default()).map_err(err)?;
        compare(&what("all_reduce"), &a, &want, n)?;
        a.copy_from_slice(&ins[r]);
        comm.reduce_scatter(&a, &mut c, O::default()).map_err(err)?;
        compare(&what("reduce_scatter"), &c, &want[mine.clone()], n)?;
        comm.all_gather(&c, &mut b).map_err(err)?;
        compare(&what("all_gather"), &b, &want, n)?;
        a.copy_from_slice(&ins[r]);
        comm.broadcast(&mut a, root).map_err(err)?;
        compare(&what("broadcast"), &a, &ins[root], 1)?;
    }
    Ok(())
}

/// Lengths of the shared-buffer calls: small (through the connections,
/// as the tuner chooses) and larger (directly; of the larger types, the
/// last in several 32 KiB blocks per rank), none dividing evenly by 3 ranks.
pub const SHARED_COUNTS: [usize; 3] = [700, 6_001, 12_003];

/// The calls that take buffers from `alloc_shared` directly (all-reduce,
/// reduce-scatter and all-gather, in place and not; broadcast in place):
/// where the tuner chooses (or `CCL_ALGO=direct` forces) it, on one host
/// each rank works on its share straight out of every rank's buffers.
/// All-reduce and broadcast take `len` elements, the gather and the
/// scatter blocks of `len / size + 1` (so their calls are as large).
fn shared<T: Elem, O: ReduceOp<T>>(g: &Group, seed: u64, call: &mut u64, len: usize, small: bool) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    *call += 1;
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, *call, k, len, small)).collect();
    let want = reference::<T, O>(&ins);
    let root = *call as usize % n;
    let what = |s: &str| format!("{s}<{}, {}> on shared buffers, {len} elements", T::NAME, O::NAME);
    let alloc = |len| comm.alloc_shared(len).map_err(err);
    let (mut x, mut y) = (alloc(len)?, alloc(len)?);
    // the gather and the scatter: every rank's blocks
    let block = len / n + 1;
    let mine = r * block..(r + 1) * block;
    let blocks: Vec<Vec<T>> = (0..n).map(|k| input(seed, *call, k + n, n * block, small)).collect();
    let scattered = reference::<T, O>(&blocks);
    let gathered: Vec<T> = blocks.iter().flat_map(|v| v[..block].to_vec()).collect();
    let (mut a, mut b, mut z) = (alloc(n * block)?, alloc(n * block)?, alloc(block)?);
    for _ in 0..2 {
        x.copy_from_slice(&ins[r]);
        comm.all_reduce_into(&x, &mut y, O::default()).map_err(err)?;
        compare(&what("all_reduce_into"), &y, &want, n)?;
        compare(&what("all_reduce_into's input"), &x, &ins[r], 1)?;
        comm.all_reduce(&mut x, O::default()).map_err(err)?;
        compare(&what("all_reduce"), &x, &want, n)?;
        x.copy_from_slice(&ins[r]);
        comm.broadcast(&mut x, root).map_err(err)?;
        compare(&what("broadcast"), &x, &ins[root], 1)?;
        a.copy_from_slice(&blocks[r]);
        comm.reduce_scatter(&a, &mut z, O::default()).map_err(err)?;
        compare(&what("reduce_scatter"), &z, &scattered[mine.clone()], n)?;
        comm.reduce_scatter_in_place(&mut a, O::default()).map_err(err)?;
        compare(&what("reduce_scatter_in_place"), &a[mine.clone()], &scattered[mine.clone()], n)?;
        z.copy_from_slice(&blocks[r][..block]);
        comm.all_gather(&z, &mut b).map_err(err)?;
        compare(&what("all_gather"), &b, &gathered, 1)?;
        a[mine.clone()].copy_from_slice(&blocks[r][..block]);
        comm.all_gather_in_place(&mut a).map_err(err)?;
        compare(&what("all_gather_in_place"), &a, &gathered, 1)?;
    }
    Ok(())
}

/// Runs the whole matrix on this rank; with `CCL_TEST_LARGE=1`, also the
/// [`large`] calls.
pub fn everything(g: &Group, seed: u64) -> Check {
    if std::env::var("CCL_TEST_LARGE").as_deref() == Ok("1") {
        large(g, seed)?;
    }
    let mut call = 0;
    for count in SHARED_COUNTS {
        shared::<f32, Sum>(g, seed, &mut call, count, true)?;
        shared::<f64, Avg>(g, seed, &mut call, count, false)?;
        shared::<i32, Prod>(g, seed, &mut call, count, true)?;
        shared::<f16, Max>(g, seed, &mut call, count, false)?;
        shared::<Moments, Sum>(g, seed, &mut call, count, true)?;
    }
    for count in COUNTS {
        reductions::<f32, Sum>(g, seed, &mut call, count, true)?;
        reductions::<f32, Sum>(g, seed, &mut call, count, false)?;
        reductions::<f64, Min>(g, seed, &mut call, count, false)?;
        reductions::<i32, Prod>(g, seed, &mut call, count, true)?;
        reductions::<u8, Sum>(g, seed, &mut call, count, false)?;
        reductions::<bf16, Sum>(g, seed, &mut call, count, true)?;
        reductions::<f16, Max>(g, seed, &mut call, count, false)?;
        reductions::<i64, BitXor>(g, seed, &mut call, count, false)?;
        reductions::<f64, Avg>(g, seed, &mut call, count, false)?;
        reductions::<i16, Avg>(g, seed, &mut call, count, true)?;
        reductions::<Moments, Sum>(g, seed, &mut call, count, true)?;
        reductions::<Moments, Min>(g, seed, &mut call, count, true)?;
        movements::<f32>(g, seed, &mut call, count)?;
        movements::<u16>(g, seed, &mut call, count)?;
        movements::<Moments>(g, seed, &mut call, count)?;
    }
    Ok(())
}
