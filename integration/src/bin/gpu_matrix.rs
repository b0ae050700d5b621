//! The collective matrix on device buffers, on ranks started by cclrun:
//! each rank on GPU `local rank % GPUs` (several ranks share a GPU when
//! there are fewer GPUs than ranks), or with `--emulated` on an emulated
//! GPU (host memory that other processes map by IPC handle, as CUDA IPC
//! maps device memory). Rank 0 draws the seed and broadcasts it
//! (or takes CCL_TEST_SEED). With `--graphs`, collectives captured into a
//! CUDA graph and replayed instead; with `--returns-early` (emulated
//! only), one all-reduce while rank 0's GPU is paused. Used by integration/gpu/check.sh on a
//! GPU machine and by integration/tests/gpu.rs here.

#[path = "../../../ccl/tests/common/mod.rs"]
#[allow(missing_docs, clippy::all)]
mod common;

use ccl::gpu::Gpu;

fn main() {
    let (g, seed) = common::world_and_seed();
    let local = std::env::var("CCL_LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(g.rank());
    let emulated = std::env::args().any(|a| a == "--emulated");
    let gpu = match if emulated { Ok(Gpu::emulated(local)) } else { Gpu::for_rank(&g) } {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("rank {}: {e}", g.rank());
            std::process::exit(2);
        }
    };
    let has = |flag: &str| std::env::args().any(|a| a == flag);
    type Run = fn(&ccl::Group, &Gpu, u64) -> Result<(), String>;
    let (run, what): (Run, _) = if has("--graphs") {
        (common::gpu_matrix::graphs_on, "graph replays correct")
    } else if has("--returns-early") {
        (common::gpu_matrix::returns_early, "returned before its GPU ran the call")
    } else {
        (common::gpu_matrix::everything_on, "all device collectives correct")
    };
    match run(&g, &gpu, seed) {
        Ok(()) => println!("rank {} of {} on {}: {what}", g.rank(), g.size(), gpu.describe()),
        Err(e) => {
            eprintln!("rank {}: {e} (CCL_TEST_SEED={seed})", g.rank());
            std::process::exit(1);
        }
    }
}
