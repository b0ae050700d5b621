//! Programs run as ranks by the tests in `tests/` through `cclrun`:
//! `coll_matrix` (every collective, checked), `gpu_matrix` (the same on
//! device buffers) and `fault` (ranks that fail on purpose). The tests find
//! `cclrun` next to their own build output.

pub mod cluster;

use std::path::PathBuf;

/// The `cclrun` binary of this build (`target/<profile>/cclrun`).
pub fn cclrun() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> → target/<profile>/cclrun
    exe.parent().and_then(|d| d.parent()).map(|d| d.join("cclrun")).unwrap_or_else(|| PathBuf::from("cclrun"))
}

/// Runs `c`, a command that starts Open MPI's `mpirun`, to its end: as
/// root where CI runs as root, and with a session directory of its own,
/// removed afterwards (two mpiruns starting at once under one TMPDIR race
/// to create the same one: `mkdir /tmp/ompi.<host>.0: File exists`,
/// orte_init failed).
pub fn run_open_mpi(c: &mut std::process::Command) -> std::io::Result<std::process::Output> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ccl-ompi-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out =
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").env("TMPDIR", &dir).output();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Runs `matrix` (a matrix binary and its arguments) as `np` ranks under
/// cclrun with small slots (several per call), a 120 s deadline and
/// `extra` cclrun arguments; asserts the job succeeded and every rank
/// printed `done`.
pub fn every_rank_passes(np: usize, extra: &[&str], matrix: &[&str], done: &str) {
    let np_s = np.to_string();
    let o = std::process::Command::new(cclrun())
        .args(["-np", &np_s, "-x", "CCL_BUFFSIZE=16384", "-x", "CCL_TIMEOUT=120"])
        .args(extra)
        .args(matrix)
        .output()
        .expect("start cclrun");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "np {np} {extra:?}: {err}");
    assert_eq!(out.matches(done).count(), np, "np {np} {extra:?}: {out}");
}
