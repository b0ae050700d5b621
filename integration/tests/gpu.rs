//! The GPU path as processes, without a GPU: ranks on emulated GPUs run
//! the device collective matrix over shared memory, where the receivers
//! map the senders' device slots by IPC handle (an emulated GPU's memory
//! is a memfd another process maps, as CUDA IPC maps device memory), and
//! over tcp, staged through host slots (the path ranks on different hosts
//! take). The same binary runs on real GPUs in integration/gpu/check.sh.

const MATRIX: &str = env!("CARGO_BIN_EXE_gpu_matrix");

fn matrix(np: usize, extra: &[&str]) {
    // small device slots: calls span several and come back to each
    let extra: Vec<&str> = ["-x", "CCL_GPU_SLOT=4096"].iter().chain(extra).copied().collect();
    ccl_integration::every_rank_passes(np, &extra, &[MATRIX, "--emulated"], "all device collectives correct");
}

#[test]
fn device_matrix_over_shm_with_ipc_mapped_slots_on_emulated_gpus() {
    for np in [2, 3, 4] {
        matrix(np, &[]);
    }
    matrix(3, &["-x", "CCL_ALGO=tree"]);
    matrix(3, &["-x", "CCL_ALGO=ring", "-x", "CCL_NCHANNELS=2"]);
}

#[test]
fn device_matrix_staged_over_tcp_on_emulated_gpus() {
    for np in [2, 3] {
        matrix(np, &["-x", "CCL_SHM_DISABLE=1"]);
    }
}
