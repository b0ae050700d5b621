//! `--backend nccl`: the same sweep through NCCL (cudarc's `nccl` module,
//! libnccl.so.2 loaded at run time), on GPU `local rank % GPUs` of each
//! rank, under cclrun: ccl's group bootstraps NCCL (rank 0's unique id is
//! broadcast through it) and gathers the times, so ccl and NCCL are
//! measured by one tool with one table. Float sum only; times run until
//! the stream has run the calls, and the host column gives how long each
//! call took to return, as for `--device cuda`.

use super::exact::{self, value};
use super::table::{self, Mode};
use super::{Args, Coll};
use ccl::{Group, Max, Sum};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, Id, ReduceOp};
use std::sync::Arc;
use std::time::Instant;

/// Whether libnccl can be loaded (cudarc panics where it cannot).
fn nccl_present() -> bool {
    ["libnccl.so.2", "libnccl.so"].iter().any(|name| {
        let c = std::ffi::CString::new(*name).unwrap_or_default();
        // SAFETY: a NUL-terminated name; the handle is closed at once.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    })
}

/// Runs the sweep on `g`'s ranks; the process exit code.
pub fn run(g: &Group, a: &Args, coll: Coll) -> i32 {
    let missing = [Coll::AllToAll, Coll::Gather, Coll::Scatter, Coll::Scan, Coll::Exscan, Coll::SendRecv, Coll::Halo];
    if a.dtype != "float" || a.op != "sum" || missing.contains(&coll) || coll.varying() {
        eprintln!(
            "ccl-perf: --backend nccl measures float sum, and no all_to_all, gather, scatter, scans, sendrecv, halo \
             or varying counts"
        );
        return 2;
    }
    if !nccl_present() {
        eprintln!("ccl-perf: --backend nccl: libnccl.so.2 not found (install NCCL, or put it on LD_LIBRARY_PATH)");
        return 2;
    }
    match sweep(g, a, coll) {
        Ok(wrong) => i32::from(wrong > 0),
        Err(e) => {
            eprintln!("ccl-perf: rank {}: --backend nccl: {e}", g.rank());
            1
        }
    }
}

type R<T> = Result<T, String>;

fn sweep(g: &Group, a: &Args, coll: Coll) -> R<u64> {
    let (n, r) = (g.size(), g.rank());
    let gpus = CudaContext::device_count().map_err(|e| format!("counting GPUs: {e:?}"))?.max(1) as usize;
    let local = std::env::var("CCL_LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(r);
    let ctx = CudaContext::new(local % gpus).map_err(|e| format!("opening GPU {}: {e:?}", local % gpus))?;
    let stream = ctx.new_stream().map_err(|e| format!("new stream: {e:?}"))?;
    // rank 0's unique id, to every rank through ccl
    let mut id = [0u8; 128];
    if r == 0 {
        let made = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
        for (b, c) in id.iter_mut().zip(made.internal()) {
            *b = *c as u8;
        }
    }
    g.typed::<u8>().broadcast(&mut id, 0).map_err(|e| e.to_string())?;
    let id = Id::uninit(id.map(|b| b as std::ffi::c_char));
    let comm = Comm::from_rank(Arc::clone(&stream), r, n, id).map_err(|e| format!("ncclCommInitRank: {e:?}"))?;
    let root = a.root.min(n - 1);
    if r == 0 {
        println!(
            "# ccl-perf: {} on {n} ranks, float sum, {} .. {} bytes ×{}, {} iters, {} warmup, backend nccl",
            coll.name(),
            a.min,
            a.max,
            a.factor,
            a.iters,
            a.warmup
        );
    }
    let unit = 4 * coll.blocks(n);
    let mut table = table::Table::new(r == 0, coll.name(), n, true);
    let mut size = a.min.max(unit);
    while size <= a.max.max(unit) {
        let bytes = size / unit * unit;
        let count = bytes / unit;
        let (li, lo) = match coll {
            Coll::AllGather => (count, n * count),
            Coll::ReduceScatter => (n * count, count),
            _ => (count, count),
        };
        let host: Vec<f32> = (0..li).map(|i| value(r, i)).collect();
        let input = stream.clone_htod(&host).map_err(|e| format!("upload: {e:?}"))?;
        let mut output = stream.alloc_zeros::<f32>(lo).map_err(|e| format!("alloc: {e:?}"))?;
        let call = |input: &CudaSlice<f32>, output: &mut CudaSlice<f32>| -> R<()> {
            let r = match coll {
                Coll::AllReduce => comm.all_reduce(input, output, &ReduceOp::Sum),
                Coll::Broadcast => comm.broadcast(Some(input), output, root as i32),
                Coll::Reduce => comm.reduce(input, Some(output), &ReduceOp::Sum, root as i32),
                Coll::AllGather => comm.all_gather(input, output),
                Coll::ReduceScatter => comm.reduce_scatter(input, output, &ReduceOp::Sum),
                _ => return Err(format!("no {}", coll.name())),
            };
            r.map(|_| ()).map_err(|e| format!("{}: {e:?}", coll.name()))
        };
        // checked once, then timed; NCCL's in place is not measured (the
        // in-place columns repeat the out-of-place measurement)
        call(&input, &mut output)?;
        let got = stream.clone_dtoh(&output).map_err(|e| format!("download: {e:?}"))?;
        let wrong = exact::wrong(coll, (n, r, root), count, &got);
        let m = timed(g, a, &stream, bytes, coll, wrong, || call(&input, &mut output))?;
        let rooted = if coll.rooted() { root as i64 } else { -1 };
        let redop = if coll.reduces() { "sum" } else { "none" };
        table.row(bytes, bytes / 4, "float", redop, rooted, &m, &m);
        if a.factor < 2 {
            break;
        }
        size = size.saturating_mul(a.factor);
    }
    table.footer();
    Ok(table.wrong())
}

/// Times `call` as ccl-perf's device sweep does.
fn timed(
    g: &Group,
    a: &Args,
    stream: &Arc<CudaStream>,
    bytes: usize,
    coll: Coll,
    wrong: u64,
    mut call: impl FnMut() -> R<()>,
) -> R<Mode> {
    let sync = || stream.synchronize().map_err(|e| format!("synchronize: {e:?}"));
    for _ in 0..a.warmup {
        call()?;
    }
    sync()?;
    g.barrier().map_err(|e| e.to_string())?;
    let iters = a.iters.max(1) as f64;
    let t = Instant::now();
    for _ in 0..a.iters.max(1) {
        call()?;
    }
    let host = t.elapsed().as_secs_f64() / iters;
    sync()?;
    let mut secs = [t.elapsed().as_secs_f64() / iters, host];
    g.typed::<f64>().all_reduce(&mut secs, Max).map_err(|e| e.to_string())?;
    let mut w = [wrong];
    g.typed::<u64>().all_reduce(&mut w, Sum).map_err(|e| e.to_string())?;
    let algbw = bytes as f64 / secs[0] / 1e9;
    let busbw = algbw * coll.busbw_factor(g.size());
    Ok(Mode { time_us: secs[0] * 1e6, algbw, busbw, wrong: w[0], host_us: Some(secs[1] * 1e6) })
}
