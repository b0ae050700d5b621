//! With cargo feature `mpi`: a ccl program under plain `mpirun` (no
//! CCL_ROOT) bootstraps through MPI. Run with
//! `cargo test -p ccl-integration --features mpi --test mpi_feature`.
#![cfg(feature = "mpi")]

use ccl_integration::cluster::unavailable;
use std::process::Command;

const MATRIX: &str = env!("CARGO_BIN_EXE_coll_matrix");

#[test]
fn plain_mpirun_bootstraps_through_mpi() {
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if unavailable("mpirun (apt install openmpi-bin)", !found) {
        return;
    }
    let o = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", "4", "-x", "CCL_DEBUG=INFO", "-x", "CCL_TIMEOUT=120", MATRIX])
        .output()
        .expect("mpirun");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(out.matches("all collectives correct").count(), 4, "{out}");
    assert!(err.contains("ccl INFO 4 ranks started by MPI"), "{err}");
}
