//! The collective matrix on device buffers: every blocking collective ×
//! type and operator pairs × counts, outputs poisoned before each call,
//! results copied back and checked against the sequential reference.
//! Shared by the thread tests on an emulated GPU (ccl/tests/gpu.rs) and
//! the process test on a real one (integration gpu_matrix, GPU check).

use super::matrix::{Check, Moments, COUNTS};
use super::{compare, input, reference, Elem};
use ccl::gpu::{DeviceBuffer, Gpu, Stream};
use ccl::{Avg, BitXor, Group, Max, Min, Prod, ReduceOp, Sum};
use half::{bf16, f16};

fn err(e: ccl::Error) -> String {
    e.to_string()
}

/// What a device buffer holds before a call writes it: random values of
/// another call, so an element the call forgets to write shows.
fn poison<T: Elem>(seed: u64, call: u64, rank: usize, len: usize) -> Vec<T> {
    input(seed, call + 7_777_777, rank, len, false)
}

struct Dev<'a> {
    gpu: &'a Gpu,
    stream: &'a Stream,
}

impl Dev<'_> {
    fn up<T: Elem>(&self, data: &[T]) -> Result<DeviceBuffer<T>, String> {
        self.gpu.upload(data, self.stream).map_err(err)
    }
    fn down<T: Elem>(&self, b: &DeviceBuffer<T>) -> Result<Vec<T>, String> {
        b.to_vec().map_err(err)
    }
}

fn reductions<T: Elem, O: ReduceOp<T>>(
    g: &Group,
    d: &Dev,
    seed: u64,
    call: &mut u64,
    count: usize,
    small: bool,
) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    *call += 1;
    let c = *call;
    let what = |s: &str| format!("device {s}<{}, {}> count {count}", T::NAME, O::NAME);
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, count, small)).collect();
    let want = reference::<T, O>(&ins);
    let send = d.up(&ins[r])?;

    let mut buf = d.up(&ins[r])?;
    comm.all_reduce(&mut buf, O::default()).map_err(err)?;
    compare(&what("all_reduce"), &d.down(&buf)?, &want, n)?;
    let mut out = d.up(&poison::<T>(seed, c, r, count))?;
    comm.all_reduce_into(&send, &mut out, O::default()).map_err(err)?;
    compare(&what("all_reduce_into"), &d.down(&out)?, &want, n)?;

    let root = (c as usize) % n;
    let mut buf = d.up(&ins[r])?;
    comm.reduce(&mut buf, O::default(), root).map_err(err)?;
    compare(&what("reduce"), &d.down(&buf)?, if r == root { &want } else { &ins[r] }, n)?;
    let mut out = d.up(&poison::<T>(seed, c, r, if r == root { count } else { 0 }))?;
    comm.reduce_into(&send, &mut out, O::default(), root).map_err(err)?;
    if r == root {
        compare(&what("reduce_into"), &d.down(&out)?, &want, n)?;
    }

    *call += 1;
    let c = *call;
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, n * count, small)).collect();
    let want = reference::<T, O>(&ins);
    let mine = &want[r * count..(r + 1) * count];
    let send = d.up(&ins[r])?;
    let mut out = d.up(&poison::<T>(seed, c, r, count))?;
    comm.reduce_scatter(&send, &mut out, O::default()).map_err(err)?;
    compare(&what("reduce_scatter"), &d.down(&out)?, mine, n)?;
    let mut buf = d.up(&ins[r])?;
    comm.reduce_scatter_in_place(&mut buf, O::default()).map_err(err)?;
    compare(&what("reduce_scatter_in_place"), &d.down(&buf)?[r * count..(r + 1) * count], mine, n)?;

    // scans: rank r against ranks 0..=r (0..r; rank 0's output untouched)
    *call += 1;
    let c = *call;
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, count, small)).collect();
    let send = d.up(&ins[r])?;
    let upto = reference::<T, O>(&ins[..=r]);
    let mut buf = d.up(&ins[r])?;
    comm.scan(&mut buf, O::default()).map_err(err)?;
    compare(&what("scan"), &d.down(&buf)?, &upto, r + 1)?;
    let poisoned = poison::<T>(seed, c, r, count);
    let mut out = d.up(&poisoned)?;
    comm.exscan_into(&send, &mut out, O::default()).map_err(err)?;
    let before = if r == 0 { poisoned } else { reference::<T, O>(&ins[..r]) };
    compare(&what("exscan_into"), &d.down(&out)?, &before, r.max(1))
}

fn movements<T: Elem>(g: &Group, d: &Dev, seed: u64, call: &mut u64, count: usize) -> Check {
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    *call += 1;
    let c = *call;
    let what = |s: &str| format!("device {s}<{}> count {count}", T::NAME);
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, count, false)).collect();
    let root = (c as usize + 1) % n;

    let mut buf = d.up(&if r == root { ins[r].clone() } else { poison(seed, c, r, count) })?;
    comm.broadcast(&mut buf, root).map_err(err)?;
    compare(&what("broadcast"), &d.down(&buf)?, &ins[root], n)?;
    let send = d.up(&if r == root { ins[r].clone() } else { Vec::new() })?;
    let mut out = d.up(&poison::<T>(seed, c, r, count))?;
    comm.broadcast_into(&send, &mut out, root).map_err(err)?;
    compare(&what("broadcast_into"), &d.down(&out)?, &ins[root], n)?;

    let all: Vec<T> = ins.concat();
    let send = d.up(&ins[r])?;
    let mut out = d.up(&poison::<T>(seed, c, r, n * count))?;
    comm.all_gather(&send, &mut out).map_err(err)?;
    compare(&what("all_gather"), &d.down(&out)?, &all, n)?;
    let mut host = poison::<T>(seed, c + 1, r, n * count);
    host[r * count..(r + 1) * count].copy_from_slice(&ins[r]);
    let mut buf = d.up(&host)?;
    comm.all_gather_in_place(&mut buf).map_err(err)?;
    compare(&what("all_gather_in_place"), &d.down(&buf)?, &all, n)?;

    let root = (c as usize + 2) % n;
    let mut out = d.up(&poison::<T>(seed, c, r, if r == root { n * count } else { 0 }))?;
    comm.gather(&send, &mut out, root).map_err(err)?;
    if r == root {
        compare(&what("gather"), &d.down(&out)?, &all, n)?;
    }
    let mine = &all[r * count..(r + 1) * count];
    let mut host = if r == root { all.clone() } else { poison(seed, c, r, count) };
    let mut buf = d.up(&host)?;
    comm.scatter_in_place(&mut buf, root).map_err(err)?;
    host = d.down(&buf)?;
    compare(&what("scatter_in_place"), if r == root { &host[r * count..(r + 1) * count] } else { &host }, mine, n)?;

    let a2a: Vec<Vec<T>> = (0..n).map(|k| input(seed, c + 1_000_000, k, n * count, false)).collect();
    let want: Vec<T> = (0..n).flat_map(|s| a2a[s][r * count..(r + 1) * count].to_vec()).collect();
    let send = d.up(&a2a[r])?;
    let mut out = d.up(&poison::<T>(seed, c, r, n * count))?;
    comm.all_to_all(&send, &mut out).map_err(err)?;
    compare(&what("all_to_all"), &d.down(&out)?, &want, n)?;
    let mut buf = d.up(&a2a[r])?;
    comm.all_to_all_in_place(&mut buf).map_err(err)?;
    compare(&what("all_to_all_in_place"), &d.down(&buf)?, &want, n)?;

    if n > 1 {
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let send = d.up(&ins[r])?;
        let mut got = d.up(&poison::<T>(seed, c, r, count))?;
        if r.is_multiple_of(2) {
            comm.send(&send, right).map_err(err)?;
            comm.recv(&mut got, left).map_err(err)?;
        } else {
            comm.recv(&mut got, left).map_err(err)?;
            comm.send(&send, right).map_err(err)?;
        }
        compare(&what("send/recv"), &d.down(&got)?, &ins[left], n)?;
        // a group of device sends and receives is refused before anything moves
        let mut got = d.up(&poison::<T>(seed, c + 2, r, count))?;
        match comm.sendrecv(&send, right, &mut got, left) {
            Err(e) if matches!(e.kind(), ccl::ErrorKind::InvalidArgument(_)) => {}
            other => return Err(what(&format!("sendrecv: {other:?}, not refused"))),
        }
    }
    Ok(())
}

/// `blocks` (by rank) placed as `counts` says over `under` (what lies
/// between them).
fn placed<T: Elem>(counts: &ccl::Counts, blocks: &[&[T]], mut under: Vec<T>) -> Vec<T> {
    for (r, b) in blocks.iter().enumerate() {
        under[counts.block(r)].copy_from_slice(b);
    }
    under
}

/// The calls whose counts vary by rank, on device buffers, outputs
/// poisoned (between blocks too, which must stay as they were).
fn varying<T: Elem, O: ReduceOp<T>>(g: &Group, d: &Dev, seed: u64, call: &mut u64, count: usize) -> Check {
    use rand::SeedableRng;
    let comm = g.typed::<T>();
    let (n, r) = (g.size(), g.rank());
    *call += 1;
    let c = *call;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ c);
    let counts = super::varying::draw_counts(&mut rng, n, count);
    let what = |s: &str| format!("device {s}<{}, {}> counts {counts:?}", T::NAME, O::NAME);
    let ins: Vec<Vec<T>> = (0..n).map(|k| input(seed, c, k, counts.count(k), true)).collect();
    let refs: Vec<&[T]> = ins.iter().map(Vec::as_slice).collect();
    let send = d.up(&ins[r])?;
    let under = poison::<T>(seed, c, r, counts.extent());
    let mut out = d.up(&under)?;
    comm.all_gatherv(&send, &mut out, &counts).map_err(err)?;
    compare(&what("all_gatherv"), &d.down(&out)?, &placed(&counts, &refs, under.clone()), n)?;
    let root = (c as usize) % n;
    let mut out = d.up(&if r == root { under.clone() } else { Vec::new() })?;
    comm.gatherv(&send, &mut out, &counts, root).map_err(err)?;
    if r == root {
        compare(&what("gatherv"), &d.down(&out)?, &placed(&counts, &refs, under), n)?;
    }

    let whole: Vec<T> = input(seed, c + 1, root, counts.extent(), true);
    let send = d.up(&if r == root { whole.clone() } else { Vec::new() })?;
    let mut out = d.up(&poison::<T>(seed, c + 1, r, counts.count(r)))?;
    comm.scatterv(&send, &mut out, &counts, root).map_err(err)?;
    compare(&what("scatterv"), &d.down(&out)?, &whole[counts.block(r)], n)?;

    let sums: Vec<Vec<T>> = (0..n).map(|k| input(seed, c + 2, k, counts.extent(), true)).collect();
    let want = reference::<T, O>(&sums);
    let send = d.up(&sums[r])?;
    let mut out = d.up(&poison::<T>(seed, c + 2, r, counts.count(r)))?;
    comm.reduce_scatterv(&send, &mut out, &counts, O::default()).map_err(err)?;
    compare(&what("reduce_scatterv"), &d.down(&out)?, &want[counts.block(r)], n)?;

    // all-to-allv: rank s sends rank d (s + d) % 3 × count / 2 elements
    let m = |s: usize, k: usize| (s + k) % 3 * count / 2;
    let sends = ccl::Counts::new(&(0..n).map(|k| m(r, k)).collect::<Vec<_>>()).map_err(err)?;
    let recvs = ccl::Counts::new(&(0..n).map(|s| m(s, r)).collect::<Vec<_>>()).map_err(err)?;
    let sent: Vec<Vec<T>> = (0..n).map(|k| input(seed, c + 3, k, (0..n).map(|j| m(k, j)).sum(), false)).collect();
    let from = |s: usize| {
        let at: usize = (0..r).map(|j| m(s, j)).sum();
        &sent[s][at..at + m(s, r)]
    };
    let blocks: Vec<&[T]> = (0..n).map(from).collect();
    let send = d.up(&sent[r])?;
    let under = poison::<T>(seed, c + 3, r, recvs.extent());
    let mut out = d.up(&under)?;
    comm.all_to_allv(&send, &sends, &mut out, &recvs).map_err(err)?;
    compare(&what("all_to_allv"), &d.down(&out)?, &placed(&recvs, &blocks, under), n)
}

/// Runs the device matrix on this rank, on `gpu` (one stream of its own).
pub fn everything_on(g: &Group, gpu: &Gpu, seed: u64) -> Check {
    let stream = gpu.stream().map_err(err)?;
    let d = Dev { gpu, stream: &stream };
    let mut call = 0;
    for count in COUNTS {
        reductions::<f32, Sum>(g, &d, seed, &mut call, count, true)?;
        reductions::<f32, Sum>(g, &d, seed, &mut call, count, false)?;
        reductions::<f64, Min>(g, &d, seed, &mut call, count, false)?;
        reductions::<i32, Prod>(g, &d, seed, &mut call, count, true)?;
        reductions::<u8, Sum>(g, &d, seed, &mut call, count, false)?;
        reductions::<bf16, Sum>(g, &d, seed, &mut call, count, true)?;
        reductions::<f16, Max>(g, &d, seed, &mut call, count, false)?;
        reductions::<i64, BitXor>(g, &d, seed, &mut call, count, false)?;
        reductions::<f64, Avg>(g, &d, seed, &mut call, count, false)?;
        reductions::<i16, Avg>(g, &d, seed, &mut call, count, true)?;
        reductions::<Moments, Sum>(g, &d, seed, &mut call, count, true)?;
        reductions::<Moments, Min>(g, &d, seed, &mut call, count, true)?;
        movements::<f32>(g, &d, seed, &mut call, count)?;
        movements::<u16>(g, &d, seed, &mut call, count)?;
        movements::<Moments>(g, &d, seed, &mut call, count)?;
        varying::<f32, Sum>(g, &d, seed, &mut call, count)?;
        varying::<Moments, Min>(g, &d, seed, &mut call, count)?;
    }
    g.barrier().map_err(err)
}

/// A CUDA graph of collectives: an all-reduce (Avg: its finishing pass
/// too) and an all-gather captured on a fresh stream, the first calls of
/// the communicator on it, then launched three times on fresh random data
/// with an eager all-reduce between launches; every result checked.
pub fn graphs_on(g: &Group, gpu: &Gpu, seed: u64) -> Check {
    let (n, r) = (g.size(), g.rank());
    let (f32s, i64s) = (g.typed::<f32>(), g.typed::<i64>());
    let stream = gpu.stream().map_err(err)?;
    let d = Dev { gpu, stream: &stream };
    let count = 3000;
    let (mut inp, mut avg) = (d.up(&vec![0.0f32; count])?, d.up(&vec![0.0f32; count])?);
    let (mut part, mut all) = (d.up(&vec![0i64; count])?, d.up(&vec![0i64; n * count])?);
    stream.begin_capture().map_err(err)?;
    f32s.all_reduce_into(&inp, &mut avg, Avg).map_err(err)?;
    i64s.all_gather(&part, &mut all).map_err(err)?;
    let graph = stream.end_capture().map_err(err)?;
    for run in 0..3u64 {
        let call = 1_000 + 10 * run;
        let ins: Vec<Vec<f32>> = (0..n).map(|k| input::<f32>(seed, call, k, count, true)).collect();
        let parts: Vec<Vec<i64>> = (0..n).map(|k| input::<i64>(seed, call + 1, k, count, false)).collect();
        inp.copy_from_host(&ins[r]).map_err(err)?;
        part.copy_from_host(&parts[r]).map_err(err)?;
        graph.launch(&stream).map_err(err)?;
        // an eager call between launches, on the same connections
        let mut eager = d.up(&parts[r])?;
        i64s.all_reduce(&mut eager, Sum).map_err(err)?;
        compare(&format!("graph run {run}: all_reduce Avg"), &d.down(&avg)?, &reference::<f32, Avg>(&ins), n)?;
        compare(&format!("graph run {run}: all_gather"), &d.down(&all)?, &parts.concat(), n)?;
        compare(
            &format!("eager all_reduce after graph run {run}"),
            &d.down(&eager)?,
            &reference::<i64, Sum>(&parts),
            n,
        )?;
    }
    g.barrier().map_err(err)
}

/// Enqueue and return on an emulated GPU: rank 0's GPU runs nothing until
/// its all-reduce (several slots long, on fresh random data) has returned,
/// so a call that waited for the GPU would never return; then the result
/// is checked. Over tcp, this is the proxy thread's work.
pub fn returns_early(g: &Group, gpu: &Gpu, seed: u64) -> Check {
    let n = 3 * 4096 + 17;
    let stream = gpu.stream().map_err(err)?;
    let inputs: Vec<Vec<f32>> = (0..g.size()).map(|r| input(seed, 1, r, n, true)).collect();
    let mut d = gpu.upload(&inputs[g.rank()], &stream).map_err(err)?;
    stream.synchronize().map_err(err)?;
    let pause = |paused| gpu.emulate(ccl::gpu::Emulation { paused, ..Default::default() }).map_err(err);
    if g.rank() == 0 {
        pause(true)?;
    }
    let call = g.typed::<f32>().all_reduce(&mut d, Sum);
    let busy = !stream.query().map_err(err)?;
    if g.rank() == 0 {
        pause(false)?;
    }
    call.map_err(err)?;
    if g.rank() == 0 && !busy {
        return Err("rank 0's all_reduce returned after its paused GPU had run it".into());
    }
    compare("all_reduce", &d.to_vec().map_err(err)?, &reference::<f32, Sum>(&inputs), g.size())?;
    g.barrier().map_err(err)
}
