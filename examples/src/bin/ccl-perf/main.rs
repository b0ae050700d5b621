//! ccl-perf: the nccl-tests benchmark for ccl.
//!
//! `cclrun -np 4 target/release/ccl-perf -b 8 -e 64M -f 4` prints, per size,
//! out-of-place and in-place time, algorithm bandwidth (size / time) and
//! bus bandwidth (algbw × nccl-tests' factor: 2(n-1)/n for all-reduce,
//! (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast
//! and reduce), and #wrong: elements that differ from the exactly
//! predictable result of a checked call. Times are the slowest rank's.

mod coll;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod exact;
#[cfg(feature = "gloo")]
mod gloo;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod socket;
mod table;

use ccl::gpu::{Gpu, Stream};
use ccl::{Avg, Buffer, BufferMut, Communicator, Group, Max, Min, Prod, Reduce, ReduceOp, Sum};
use clap::Parser;
use coll::{halo_dirs, neighbour, Coll};
use half::{bf16, f16};
use std::time::Instant;
use table::Mode;

#[derive(Parser, Debug)]
#[command(name = "ccl-perf", about = "nccl-tests style benchmark of ccl collectives")]
struct Args {
    /// Collective: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, gather,
    /// scatter, scan, exscan; sendrecv (to rank + 1, from rank - 1) and halo (to and from the
    /// ranks 1 and 2 on either side, one group); all_gatherv, reduce_scatterv, all_to_allv,
    /// gatherv, scatterv (on equal counts)
    #[arg(short = 'C', long = "coll", default_value = "all_reduce")]
    coll: String,
    /// Smallest size in bytes (K, M, G suffixes)
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = bytes)]
    min: usize,
    /// Largest size in bytes
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = bytes)]
    max: usize,
    /// Multiply the size by this much each step
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: usize,
    /// Timed iterations per size
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Untimed iterations first
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Then warm up for about this long too (ms; for example to drain the
    /// token bucket of a shaped link, so that the timed calls see its rate)
    #[arg(long = "warmup_ms", alias = "warmup-ms", default_value_t = 0.0)]
    warmup_ms: f64,
    /// Check results (1) or not (0)
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u8,
    /// Operator: sum, prod, min, max, avg
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Type: float, double, half, bfloat16, int8, uint8, int32, uint32, int64, uint64
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Root of broadcast, reduce, gather and scatter
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Force an algorithm (as CCL_ALGO)
    #[arg(long)]
    algo: Option<String>,
    /// Also write the results as JSON to this file (rank 0)
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Also draw busbw against size (out of place and in place) as SVG to this file (rank 0)
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// What to measure: ccl; mpi (the same sweep through MPI under mpirun; needs feature mpi);
    /// socket (raw TCP between ranks 0 and 1, the yardstick for ccl's TCP transport);
    /// gloo (Gloo's all-reduce, --algo ring_chunked|halving_doubling|ring|bcube, under cclrun on
    /// one host; needs feature gloo); nccl (NCCL on GPU local_rank % GPUs, under cclrun; needs
    /// feature nccl and libnccl.so.2 at run time)
    #[arg(long, default_value = "ccl")]
    backend: String,
    /// Where the buffers live: host; cuda (GPU local_rank % GPUs; needs feature cuda);
    /// emulated (host memory posing as a GPU: exercises the device path without one)
    #[arg(long, default_value = "host")]
    device: String,
    /// Host buffers from `comm.alloc_shared` (memory every rank of the host maps: all_reduce
    /// reads the peers' inputs and writes their outputs directly), as nccl-tests' -R with
    /// registered buffers
    #[arg(long)]
    shared: bool,
    /// Host buffers registered with the group's RDMA devices (`comm.register`): messages over
    /// RDMA go straight from them, not through a copy into slots (no effect without RDMA)
    #[arg(long)]
    register: bool,
}

fn bytes(s: &str) -> Result<usize, String> {
    ccl_examples::parse_bytes(s)
}

/// Element types the benchmark can fill with exactly reducible values.
trait Elem: Reduce + PartialEq {
    fn of(v: i64) -> Self;
    fn name() -> &'static str;
}

macro_rules! elem {
    ($($t:ty => $n:literal, |$v:ident| $e:expr);* $(;)?) => {$(
        impl Elem for $t {
            fn of($v: i64) -> Self { $e }
            fn name() -> &'static str { $n }
        }
    )*};
}

elem! {
    f32 => "float", |v| v as f32;
    f64 => "double", |v| v as f64;
    f16 => "half", |v| f16::from_f32(v as f32);
    bf16 => "bfloat16", |v| bf16::from_f32(v as f32);
    i8 => "int8", |v| v as i8;
    u8 => "uint8", |v| v as u8;
    i32 => "int32", |v| v as i32;
    u32 => "uint32", |v| v as u32;
    i64 => "int64", |v| v;
    u64 => "uint64", |v| v as u64;
}

/// Rank `r`'s value at input position `i`: small integers (1 or 2 for
/// products), so every reduction is exact in every type and order.
fn value<T: Elem>(r: usize, i: usize, prod: bool) -> T {
    if prod {
        T::of(1 + ((r + i) % 2) as i64)
    } else {
        T::of(((r * 7 + i * 13) % 11) as i64)
    }
}

struct Bench<'a, T: Elem, O: ReduceOp<T>> {
    comm: Communicator<T>,
    g: &'a Group,
    a: &'a Args,
    coll: Coll,
    op: O,
    gpu: Option<(Gpu, Stream)>,
    /// The counts of the varying calls of the size being timed (made once
    /// per size, as a program keeps its counts while they hold).
    counts: std::cell::RefCell<Option<ccl::Counts>>,
}

impl<T: Elem, O: ReduceOp<T>> Bench<'_, T, O> {
    /// Input and output lengths for `count` (elements per rank's block).
    fn lens(&self, count: usize) -> (usize, usize) {
        self.coll.lens((self.g.size(), self.g.rank(), self.a.root), count)
    }

    fn call<I, Out>(&self, input: &I, output: &mut Out, in_place: bool) -> ccl::Result<()>
    where
        I: Buffer<T> + ?Sized,
        Out: BufferMut<T> + ?Sized,
    {
        let (c, root, op) = (&self.comm, self.a.root, self.op);
        match (self.coll, in_place) {
            (Coll::AllReduce, false) => c.all_reduce_into(input, output, op),
            (Coll::AllReduce, true) => c.all_reduce(output, op),
            (Coll::AllGather, false) => c.all_gather(input, output),
            (Coll::AllGather, true) => c.all_gather_in_place(output),
            (Coll::ReduceScatter, false) => c.reduce_scatter(input, output, op),
            (Coll::ReduceScatter, true) => c.reduce_scatter_in_place(output, op),
            (Coll::Broadcast, false) => c.broadcast_into(input, output, root),
            (Coll::Broadcast, true) => c.broadcast(output, root),
            (Coll::Reduce, false) => c.reduce_into(input, output, op, root),
            (Coll::Reduce, true) => c.reduce(output, op, root),
            (Coll::AllToAll, false) => c.all_to_all(input, output),
            (Coll::AllToAll, true) => c.all_to_all_in_place(output),
            (Coll::Gather, false) => c.gather(input, output, root),
            (Coll::Gather, true) => c.gather_in_place(output, root),
            (Coll::Scatter, false) => c.scatter(input, output, root),
            (Coll::Scatter, true) => c.scatter_in_place(output, root),
            (Coll::Scan, false) => c.scan_into(input, output, op),
            (Coll::Scan, true) => c.scan(output, op),
            (Coll::Exscan, false) => c.exscan_into(input, output, op),
            (Coll::Exscan, true) => c.exscan(output, op),
            // (no in-place form: both columns time the call out of place)
            (Coll::SendRecv, _) => {
                let (r, n) = (self.g.rank(), self.g.size());
                c.sendrecv(input, neighbour(r, 1, n), output, neighbour(r, -1, n))
            }
            (Coll::Halo, _) => Err(ccl::Error::new(ccl::ErrorKind::InvalidArgument("halo: host buffers only".into()))),
            (v, _) => self.call_varying(v, input, output, in_place),
        }
    }

    /// A varying call on equal counts (OSU's benchmarks time them so).
    fn call_varying<I, Out>(&self, coll: Coll, input: &I, output: &mut Out, in_place: bool) -> ccl::Result<()>
    where
        I: Buffer<T> + ?Sized,
        Out: BufferMut<T> + ?Sized,
    {
        let (c, root, op, n) = (&self.comm, self.a.root, self.op, self.g.size());
        let count = self.count_of(input.elems(), output.elems());
        let mut kept = self.counts.borrow_mut();
        let counts = match kept.take() {
            Some(c) if c.count(0) == count => c,
            _ => ccl::Counts::new(&vec![count; n])?,
        };
        let counts = &*kept.insert(counts);
        match (coll, in_place) {
            (Coll::AllGatherV, false) => c.all_gatherv(input, output, counts),
            (Coll::AllGatherV, true) => c.all_gatherv_in_place(output, counts),
            (Coll::ReduceScatterV, _) => c.reduce_scatterv(input, output, counts, op),
            (Coll::AllToAllV, _) => c.all_to_allv(input, counts, output, counts),
            (Coll::GatherV, _) => c.gatherv(input, output, counts, root),
            (Coll::ScatterV, _) => c.scatterv(input, output, counts, root),
            _ => Err(ccl::Error::new(ccl::ErrorKind::InvalidArgument(format!("{} has no varying form", coll.name())))),
        }
    }

    /// Elements per rank's block of a call on buffers of `li` and `lo`
    /// elements (see [`Coll::lens`]).
    fn count_of(&self, li: usize, lo: usize) -> usize {
        match self.coll.base() {
            Coll::AllToAll => li / self.g.size().max(1),
            Coll::ReduceScatter | Coll::Scatter => lo,
            _ => li,
        }
    }

    /// Block k of `input` to the k-th direction's neighbour, block k of
    /// `output` from the opposite one, all in one group.
    fn halo(&self, input: &[T], output: &mut [T]) -> ccl::Result<()> {
        let (r, n) = (self.g.rank(), self.g.size());
        let dirs = halo_dirs(n);
        let count = input.len() / dirs.len().max(1);
        self.comm.grouped(|g| {
            for ((k, &d), out) in dirs.iter().enumerate().zip(output.chunks_mut(count.max(1))) {
                g.send(&input[k * count..(k + 1) * count], neighbour(r, d, n))?;
                g.recv(out, neighbour(r, -d, n))?;
            }
            Ok(())
        })
    }

    /// Fills the buffers for a checked call; the in-place buffer is laid out
    /// as the in-place form expects.
    fn fill(&self, count: usize, input: &mut [T], output: &mut [T], in_place: bool) {
        let (r, prod) = (self.g.rank(), O::NAME == "prod");
        for (i, x) in input.iter_mut().enumerate() {
            *x = value(r, i, prod);
        }
        output.iter_mut().for_each(|x| *x = T::zeroed());
        if in_place {
            let base = self.coll.base();
            let gathers = base == Coll::AllGather || base == Coll::Gather && r == self.a.root;
            let off = if gathers { r * count } else { 0 };
            let n = input.len().min(output.len() - off);
            output[off..off + n].copy_from_slice(&input[..n]);
        }
    }

    /// Elements of this rank's result that differ from the prediction.
    fn wrong(&self, count: usize, out: &[T], in_place: bool) -> u64 {
        let (n, r, root, prod) = (self.g.size(), self.g.rank(), self.a.root, O::NAME == "prod");
        // the reduction of ranks 0..k at position i
        let fold = |k: usize, i: usize| {
            let mut acc = value::<T>(0, i, prod);
            for s in 1..k {
                acc = O::combine(acc, value(s, i, prod));
            }
            let mut one = [acc];
            O::finish(&mut one, k);
            one[0]
        };
        let c = count.max(1);
        let want = |q: usize| -> Option<T> {
            Some(match self.coll.base() {
                Coll::AllReduce => fold(n, q),
                Coll::Reduce if r == root => fold(n, q),
                Coll::Reduce => return None,
                Coll::Broadcast => value(root, q, prod),
                Coll::AllGather => value(q / c, q % c, prod),
                Coll::ReduceScatter if in_place => {
                    if q / c != r {
                        return None;
                    }
                    fold(n, q)
                }
                Coll::ReduceScatter => fold(n, r * count + q),
                Coll::AllToAll => value(q / c, r * count + q % c, prod),
                Coll::Gather if r == root => value(q / c, q % c, prod),
                Coll::Gather => return None,
                Coll::Scatter if in_place && r == root => value(root, q, prod),
                Coll::Scatter => value(root, r * count + q, prod),
                Coll::Scan => fold(r + 1, q),
                Coll::Exscan if r == 0 => return None,
                Coll::Exscan => fold(r, q),
                Coll::SendRecv => value(neighbour(r, -1, n), q, prod),
                Coll::Halo => {
                    let k = q / c;
                    value(neighbour(r, -halo_dirs(n)[k], n), q, prod)
                }
                // (never a base: the varying forms are their base's)
                _ => return None,
            })
        };
        out.iter().enumerate().filter(|(q, x)| want(*q).is_some_and(|w| w != **x)).count() as u64
    }

    fn mode(&self, count: usize, bytes: usize, in_place: bool) -> ccl::Result<Mode> {
        let in_place = in_place && self.coll.has_in_place();
        let (li, lo) = self.lens(count);
        let lo = if in_place { li.max(lo) } else { lo };
        let Some((gpu, stream)) = &self.gpu else {
            if self.a.shared {
                let (input, output) = (self.comm.alloc_shared(li)?, self.comm.alloc_shared(lo)?);
                return self.on_host(count, bytes, input, output, in_place);
            }
            let (mut input, mut output) = (vec![T::zeroed(); li], vec![T::zeroed(); lo]);
            if self.a.register {
                let (input, output) = (self.comm.register(&mut input)?, self.comm.register(&mut output)?);
                return self.on_host(count, bytes, input, output, in_place);
            }
            return self.on_host(count, bytes, input, output, in_place);
        };
        let mut input = vec![T::zeroed(); li];
        let mut output = vec![T::zeroed(); lo];
        let check = self.a.check != 0;
        if check {
            self.fill(count, &mut input, &mut output, in_place);
        }
        let din = gpu.upload(&input, stream)?;
        let mut dout = gpu.upload(&output, stream)?;
        if check {
            self.call(&din, &mut dout, in_place)?;
            dout.copy_to_host(&mut output)?;
        }
        let wrong = if check { self.wrong(count, &output, in_place) } else { 0 };
        self.timed(bytes, wrong, Some(stream), || self.call(&din, &mut dout, in_place))
    }

    /// Checks (if asked) and times the call on host buffers.
    fn on_host<B>(&self, count: usize, bytes: usize, mut input: B, mut output: B, in_place: bool) -> ccl::Result<Mode>
    where
        B: BufferMut<T> + std::ops::DerefMut<Target = [T]>,
    {
        let check = self.a.check != 0;
        let call = |input: &B, output: &mut B| match self.coll {
            Coll::Halo => self.halo(input, output),
            _ => self.call(input, output, in_place),
        };
        if check {
            self.fill(count, &mut input, &mut output, in_place);
            call(&input, &mut output)?;
        }
        let wrong = if check { self.wrong(count, &output, in_place) } else { 0 };
        self.timed(bytes, wrong, None, || call(&input, &mut output))
    }

    /// Times `call` (warm-up first); the slowest rank's time and the wrong
    /// elements of all ranks. Device calls (`stream`) return before the GPU
    /// has run them: the time is until the stream has run the last one, and
    /// the host time how long the calls took to return.
    fn timed(
        &self,
        bytes: usize,
        wrong: u64,
        stream: Option<&Stream>,
        mut call: impl FnMut() -> ccl::Result<()>,
    ) -> ccl::Result<Mode> {
        let idle = || stream.map_or(Ok(()), Stream::synchronize);
        for _ in 0..self.a.warmup {
            call()?;
        }
        if self.a.warmup_ms > 0.0 {
            // as many calls as fill the time at the slowest rank's pace: every rank makes as many
            idle()?;
            let t = Instant::now();
            call()?;
            idle()?;
            let calls = (self.a.warmup_ms * 1e-3 / t.elapsed().as_secs_f64().max(1e-7)).ceil();
            let mut more = [calls as u64];
            self.g.typed::<u64>().all_reduce(&mut more, Min)?;
            for _ in 1..more[0] {
                call()?;
            }
        }
        idle()?;
        self.g.barrier()?;
        let iters = self.a.iters.max(1) as f64;
        let t = Instant::now();
        for _ in 0..self.a.iters.max(1) {
            call()?;
        }
        let host = t.elapsed().as_secs_f64() / iters;
        idle()?;
        let mut secs = [t.elapsed().as_secs_f64() / iters, host];
        self.g.typed::<f64>().all_reduce(&mut secs, Max)?;
        let mut w = [wrong];
        self.g.typed::<u64>().all_reduce(&mut w, Sum)?;
        let algbw = bytes as f64 / secs[0] / 1e9;
        let busbw = algbw * self.coll.busbw_factor(self.g.size());
        let host_us = stream.map(|_| secs[1] * 1e6);
        Ok(Mode { time_us: secs[0] * 1e6, algbw, busbw, wrong: w[0], host_us })
    }

    /// The device's copy bandwidth (GB/s, read + write counted once, as
    /// nccl-tests' busbw of a copy) over `bytes`, the ceiling for busbw.
    fn copy_ceiling(&self, bytes: usize) -> ccl::Result<Option<f64>> {
        let Some((gpu, stream)) = &self.gpu else { return Ok(None) };
        let len = (bytes / std::mem::size_of::<T>()).max(1);
        let (src, mut dst) = (gpu.alloc::<T>(len, stream)?, gpu.alloc::<T>(len, stream)?);
        dst.copy_from(&src)?;
        stream.synchronize()?;
        let reps = 10;
        let t = Instant::now();
        for _ in 0..reps {
            dst.copy_from(&src)?;
        }
        stream.synchronize()?;
        Ok(Some((len * std::mem::size_of::<T>()) as f64 * reps as f64 / t.elapsed().as_secs_f64() / 1e9))
    }

    fn sweep(&self) -> ccl::Result<table::Table> {
        let n = self.g.size();
        let elem = std::mem::size_of::<T>();
        let unit = elem * self.coll.blocks(n);
        let root = if self.coll.rooted() { self.a.root as i64 } else { -1 };
        let redop = if self.coll.reduces() { O::NAME } else { "none" };
        if let Some(bw) = self.copy_ceiling(self.a.max.clamp(unit, 1 << 30))? {
            if self.g.rank() == 0 {
                println!(
                    "# device-to-device copy of {} B: {bw:.2} GB/s (the ceiling for busbw)",
                    self.a.max.clamp(unit, 1 << 30)
                );
            }
        }
        let mut table = table::Table::new(self.g.rank() == 0, self.coll.name(), n, self.gpu.is_some());
        let mut size = self.a.min.max(unit);
        while size <= self.a.max.max(unit) {
            let bytes = size / unit * unit;
            let count = bytes / unit;
            let oop = self.mode(count, bytes, false)?;
            let ip = self.mode(count, bytes, true)?;
            table.row(bytes, bytes / elem, T::name(), redop, root, &oop, &ip);
            if self.a.factor < 2 {
                break;
            }
            size = size.saturating_mul(self.a.factor);
        }
        table.footer();
        if table.wrong() > 0 {
            std::process::exit(1);
        }
        Ok(table)
    }
}

fn run_op<T: Elem>(g: &Group, a: &Args, coll: Coll) -> ccl::Result<table::Table>
where
    Sum: ReduceOp<T>,
    Prod: ReduceOp<T>,
    Min: ReduceOp<T>,
    Max: ReduceOp<T>,
    Avg: ReduceOp<T>,
{
    let comm = g.typed::<T>();
    let gpu = match a.device.as_str() {
        "host" => None,
        d => {
            let local = std::env::var("CCL_LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(g.rank());
            let gpu = if d == "emulated" { Gpu::emulated(local) } else { Gpu::for_rank(g)? };
            let stream = gpu.stream()?;
            if g.rank() == 0 {
                println!("# buffers on {} (rank 0; each rank: local rank % GPUs)", gpu.describe());
            }
            Some((gpu, stream))
        }
    };
    match a.op.as_str() {
        "sum" => Bench { comm, g, a, coll, op: Sum, gpu, counts: Default::default() }.sweep(),
        "prod" => Bench { comm, g, a, coll, op: Prod, gpu, counts: Default::default() }.sweep(),
        "min" => Bench { comm, g, a, coll, op: Min, gpu, counts: Default::default() }.sweep(),
        "max" => Bench { comm, g, a, coll, op: Max, gpu, counts: Default::default() }.sweep(),
        "avg" => Bench { comm, g, a, coll, op: Avg, gpu, counts: Default::default() }.sweep(),
        o => Err(ccl::Error::new(ccl::ErrorKind::InvalidArgument(format!("unknown op {o:?}")))),
    }
}

/// The memory bandwidth yardstick, measured in the same run: every rank
/// copies `bytes` at once (as many copies as ranks), best of 5.
fn memcpy_line(g: &Group, bytes: usize) -> ccl::Result<()> {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in
    let mut best = [f64::INFINITY];
    for _ in 0..5 {
        g.barrier()?;
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        let mut secs = [t.elapsed().as_secs_f64()];
        g.typed::<f64>().all_reduce(&mut secs, Max)?;
        best[0] = best[0].min(secs[0]);
    }
    if g.rank() == 0 {
        let total = (g.size() * bytes) as f64 / best[0] / 1e9;
        println!(
            "# memcpy: {} rank(s) each copying {} MiB at once: {total:.2} GB/s in total, {:.2} GB/s each",
            g.size(),
            bytes >> 20,
            total / g.size() as f64
        );
    }
    Ok(())
}

fn main() -> ccl::Result<()> {
    let a = Args::parse();
    let Some(coll) = Coll::parse(&a.coll) else {
        eprintln!("ccl-perf: unknown collective {:?}", a.coll);
        std::process::exit(2);
    };
    if a.warmup_ms != 0.0 && (a.backend != "ccl" || !a.warmup_ms.is_finite() || a.warmup_ms < 0.0) {
        eprintln!("ccl-perf: --warmup_ms takes a time in ms, with the ccl backend only (got {})", a.warmup_ms);
        std::process::exit(2);
    }
    match a.backend.as_str() {
        "ccl" | "socket" | "nccl" => {}
        #[cfg(feature = "mpi")]
        "mpi" => std::process::exit(mpi::run(&a, coll)),
        #[cfg(not(feature = "mpi"))]
        "mpi" => {
            eprintln!("ccl-perf: --backend mpi needs a build with `--features mpi`");
            std::process::exit(2);
        }
        #[cfg(feature = "gloo")]
        "gloo" => std::process::exit(gloo::run(&a, coll)),
        #[cfg(not(feature = "gloo"))]
        "gloo" => {
            eprintln!("ccl-perf: --backend gloo needs a build with `--features gloo` (and libgloo-dev)");
            std::process::exit(2);
        }
        b => {
            eprintln!("ccl-perf: unknown backend {b:?} (ccl, mpi, socket, gloo, nccl)");
            std::process::exit(2);
        }
    }
    if !matches!(a.device.as_str(), "host" | "cuda" | "emulated") {
        eprintln!("ccl-perf: unknown device {:?} (host, cuda, emulated)", a.device);
        std::process::exit(2);
    }
    if let Some(algo) = &a.algo {
        // before init, while this process has one thread
        std::env::set_var("CCL_ALGO", algo);
    }
    let g = ccl::init()?;
    if a.backend == "socket" {
        return socket::run(&g, &a);
    }
    if a.backend == "nccl" {
        #[cfg(feature = "nccl")]
        std::process::exit(nccl::run(&g, &a, coll));
        #[cfg(not(feature = "nccl"))]
        {
            eprintln!("ccl-perf: --backend nccl needs a build with `--features nccl`");
            std::process::exit(2);
        }
    }
    if g.rank() == 0 {
        let hosts = g.hosts().groups().len();
        println!(
            "# ccl-perf: {} on {} ranks ({} host{}), {} {}, {} .. {} bytes ×{}, {} iters, {} warmup{}, algo {}",
            coll.name(),
            g.size(),
            hosts,
            if hosts == 1 { "" } else { "s" },
            a.dtype,
            a.op,
            a.min,
            a.max,
            a.factor,
            a.iters,
            a.warmup,
            if a.warmup_ms > 0.0 { format!(" and {} ms", a.warmup_ms) } else { String::new() },
            a.algo.as_deref().unwrap_or("auto")
        );
    }
    let table = match a.dtype.as_str() {
        "float" | "f32" => run_op::<f32>(&g, &a, coll),
        "double" | "f64" => run_op::<f64>(&g, &a, coll),
        "half" | "f16" => run_op::<f16>(&g, &a, coll),
        "bfloat16" | "bf16" => run_op::<bf16>(&g, &a, coll),
        "int8" => run_op::<i8>(&g, &a, coll),
        "uint8" => run_op::<u8>(&g, &a, coll),
        "int32" | "int" => run_op::<i32>(&g, &a, coll),
        "uint32" => run_op::<u32>(&g, &a, coll),
        "int64" => run_op::<i64>(&g, &a, coll),
        "uint64" => run_op::<u64>(&g, &a, coll),
        t => {
            eprintln!("ccl-perf: unknown datatype {t:?}");
            std::process::exit(2);
        }
    }?;
    // after the sweep: copying that much memory just before it slowed the
    // sizes timed first (2 ranks, -b 8 -e 16M -f 8 -n 30 -w 3: 32 KiB out
    // of place 5.7-6.4 us, against 3.6-3.8 with -e 256K, which copies
    // nothing; 3.7-4.3 with the copy after), where the MPI and Gloo
    // backends, which print no yardstick, were not slowed
    if a.max >= 1 << 20 {
        memcpy_line(&g, a.max.min(64 << 20))?;
    }
    let title = format!("ccl-perf {} on {} ranks ({})", a.coll, g.size(), a.dtype);
    if let Err(code) = table.save(a.plot.as_deref(), a.json.as_deref(), &title, "ccl") {
        std::process::exit(code);
    }
    Ok(())
}
