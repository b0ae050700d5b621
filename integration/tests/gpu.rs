//! The GPU path as processes, without a GPU: ranks on emulated GPUs run
//! the device collective matrix staged over tcp (the path ranks on
//! different hosts take), and over shared memory, where device slots
//! would be mapped by CUDA IPC, an emulated GPU's memory cannot cross
//! processes: every rank fails with that error, nothing hangs. The same
//! binary runs on real GPUs in integration/gpu/check.sh.

use ccl_integration::cclrun;
use std::process::Command;

const MATRIX: &str = env!("CARGO_BIN_EXE_gpu_matrix");

#[test]
fn device_matrix_staged_over_tcp_on_emulated_gpus() {
    for np in ["2", "3"] {
        let o = Command::new(cclrun())
            .args(["-np", np, "-x", "CCL_SHM_DISABLE=1", "-x", "CCL_BUFFSIZE=4096", "-x", "CCL_TIMEOUT=120"])
            .args([MATRIX, "--emulated"])
            .output()
            .expect("start cclrun");
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "np {np}: {err}");
        assert_eq!(out.matches("all device collectives correct").count(), np.parse::<usize>().unwrap_or(0), "{out}");
    }
}

#[test]
fn emulated_device_memory_over_shm_is_an_error_not_a_hang() {
    let o = Command::new(cclrun())
        .args(["-np", "2", "-x", "CCL_TIMEOUT=60", MATRIX, "--emulated"])
        .output()
        .expect("start cclrun");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("GPU: an emulated GPU's memory cannot be mapped into another process"), "{err}");
    assert!(err.contains("rank 0, all_reduce #") && err.contains("rank 1, all_reduce #"), "{err}");
}
