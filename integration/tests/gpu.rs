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
fn collectives_captured_into_graphs_replay_across_processes() {
    for np in [2, 3] {
        ccl_integration::every_rank_passes(np, &[], &[MATRIX, "--emulated", "--graphs"], "graph replays correct");
    }
}

#[test]
fn capturing_a_call_staged_over_tcp_is_an_error_naming_it() {
    let o = std::process::Command::new(ccl_integration::cclrun())
        .args(["-np", "2", "-x", "CCL_SHM_DISABLE=1", "-x", "CCL_TIMEOUT=20", MATRIX, "--emulated", "--graphs"])
        .output()
        .expect("start cclrun");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("cannot be captured into a graph: its bytes need the host at every run"), "{err}");
}

#[test]
fn a_call_staged_over_tcp_returns_before_the_gpu_has_run_it() {
    // without the proxy thread, rank 0's call would wait for its paused GPU
    for (np, algo) in [(2, "ring"), (3, "ring"), (3, "tree")] {
        let extra = ["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_GPU_SLOT=4096", "-x", &format!("CCL_ALGO={algo}")];
        let args = [MATRIX, "--emulated", "--returns-early"];
        ccl_integration::every_rank_passes(np, &extra, &args, "returned before its GPU ran the call");
    }
}

#[test]
fn device_matrix_staged_over_tcp_on_emulated_gpus() {
    for np in [2, 3] {
        matrix(np, &["-x", "CCL_SHM_DISABLE=1"]);
    }
}
