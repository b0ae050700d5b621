//! The collective matrix on device buffers, on ranks started by cclrun:
//! each rank on GPU `local rank % GPUs` (several ranks share a GPU when
//! there are fewer GPUs than ranks), or with `--emulated` on an emulated
//! GPU (host memory; crosses processes only staged over tcp, so run it
//! with `-x CCL_SHM_DISABLE=1`). Rank 0 draws the seed and broadcasts it
//! (or takes CCL_TEST_SEED). Used by integration/gpu/check.sh on a GPU
//! machine and by integration/tests/gpu.rs here.

#[path = "../../../ccl/tests/common/mod.rs"]
#[allow(missing_docs, clippy::all)]
mod common;

use ccl::gpu::Gpu;

fn main() {
    let g = match ccl::init() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("init: {e}");
            std::process::exit(2);
        }
    };
    let local = std::env::var("CCL_LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(g.rank());
    let gpu =
        if std::env::args().any(|a| a == "--emulated") { Ok(Gpu::emulated(local)) } else { Gpu::for_local_rank(local) };
    let gpu = match gpu {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("rank {}: {e}", g.rank());
            std::process::exit(2);
        }
    };
    let mut seed =
        [std::env::var("CCL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>)];
    if let Err(e) = g.typed::<u64>().broadcast(&mut seed, 0) {
        eprintln!("seed broadcast: {e}");
        std::process::exit(1);
    }
    match common::gpu_matrix::everything_on(&g, &gpu, seed[0]) {
        Ok(()) => println!("rank {} of {} on {}: all device collectives correct", g.rank(), g.size(), gpu.describe()),
        Err(e) => {
            eprintln!("rank {}: {e} (CCL_TEST_SEED={})", g.rank(), seed[0]);
            std::process::exit(1);
        }
    }
}
