//! The GPU path as processes, without a GPU: ranks on emulated GPUs run
//! the device collective matrix over shared memory, where the receivers
//! map the senders' device slots by IPC handle (an emulated GPU's memory
//! is a memfd another process maps, as CUDA IPC maps device memory), and
//! over tcp, staged through host slots (the path ranks on different hosts
//! take). The same binary runs on real GPUs in integration/gpu/check.sh.

use ccl_integration::cclrun;
use std::process::Command;

const MATRIX: &str = env!("CARGO_BIN_EXE_gpu_matrix");

fn matrix(np: &str, extra: &[&str]) {
    let o = Command::new(cclrun())
        .args(["-np", np, "-x", "CCL_BUFFSIZE=4096", "-x", "CCL_TIMEOUT=120"])
        .args(extra)
        .args([MATRIX, "--emulated"])
        .output()
        .expect("start cclrun");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "np {np} {extra:?}: {err}");
    assert_eq!(out.matches("all device collectives correct").count(), np.parse::<usize>().unwrap_or(0), "{out}");
}

#[test]
fn device_matrix_over_shm_with_ipc_mapped_slots_on_emulated_gpus() {
    for np in ["2", "3", "4"] {
        matrix(np, &[]);
    }
    matrix("3", &["-x", "CCL_ALGO=tree"]);
}

#[test]
fn device_matrix_staged_over_tcp_on_emulated_gpus() {
    for np in ["2", "3"] {
        matrix(np, &["-x", "CCL_SHM_DISABLE=1"]);
    }
}
