//! With cargo feature `mpi`: a ccl program under plain `mpirun` (no
//! CCL_ROOT) bootstraps through MPI. Run with
//! `cargo test -p ccl-integration --features mpi --test mpi_feature`.
#![cfg(feature = "mpi")]

use ccl_integration::cluster::unavailable;
use ccl_integration::run_open_mpi;
use std::process::Command;

const MATRIX: &str = env!("CARGO_BIN_EXE_coll_matrix");

#[test]
fn plain_mpirun_bootstraps_through_mpi() {
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if unavailable("mpirun (apt install openmpi-bin)", !found) {
        return;
    }
    let mut mpirun = Command::new("mpirun");
    mpirun.args(["--oversubscribe", "-np", "4", "-x", "CCL_DEBUG=INFO", "-x", "CCL_TIMEOUT=120", MATRIX]);
    let o = run_open_mpi(&mut mpirun).expect("mpirun");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(out.matches("all collectives correct").count(), 4, "{out}");
    assert!(err.contains("ccl INFO 4 ranks started by MPI"), "{err}");
}

/// `ccl-perf --backend mpi` (scripts/test.sh builds ccl-perf with feature
/// `mpi` before this test): the same table, through Open MPI, checked.
#[test]
fn ccl_perf_through_mpi() {
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if unavailable("mpirun (apt install openmpi-bin)", !found) {
        return;
    }
    let perf = ccl_integration::cclrun().with_file_name("ccl-perf");
    let json = std::env::temp_dir().join(format!("mpi-{}.json", std::process::id()));
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"] {
        let mut mpirun = Command::new("mpirun");
        mpirun.args(["--oversubscribe", "-np", "3"]).arg(&perf);
        mpirun.args([
            "--backend",
            "mpi",
            "-C",
            coll,
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
            "--json",
        ]);
        let o = run_open_mpi(mpirun.arg(&json)).expect("mpirun");
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{coll}: {out}{err}");
        assert!(out.contains("backend mpi") && out.contains("# Out of bounds values : 0 OK"), "{coll}: {out}");
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 5, "{coll}: {out}");
        let doc = std::fs::read_to_string(&json).expect("json written");
        assert!(doc.contains("\"backend\": \"MPI\"") && doc.contains(&format!("\"coll\": \"{coll}\"")), "{doc}");
    }
    let _ = std::fs::remove_file(json);
}
