//! ccl programs started by Open MPI's mpirun: with `CCL_ROOT` and
//! `CCL_SECRET` (rank 0 hosts the rendezvous), and through
//! `cclrun --via mpirun`. Needs mpirun; skips without it unless
//! CCL_TEST_REQUIRE_ALL=1. `cclrun --via srun` is checked by its
//! `--dry-run` line (no Slurm here).

use ccl_integration::cluster::unavailable;
use ccl_integration::{cclrun, run_open_mpi};
use std::process::{Command, Output};

const MATRIX: &str = env!("CARGO_BIN_EXE_coll_matrix");

fn no_mpirun() -> bool {
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    unavailable("mpirun (apt install openmpi-bin)", !found)
}

fn correct(o: &Output, np: usize) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(out.matches("all collectives correct").count(), np, "{out}\n{err}");
}

/// A port free now and below Linux's ephemeral range (32768-60999 by
/// default), so that the listeners mpirun opens for itself, on ports the
/// kernel picks from that range, cannot take it before rank 0 binds it
/// (a port the kernel had picked once was taken so: "rendezvous bind
/// 0.0.0.0:46407: Address already in use").
fn free_port() -> u16 {
    (0..1000)
        .map(|_| rand::Rng::gen_range(&mut rand::thread_rng(), 20000..32000))
        .find(|&p| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok())
        .expect("a free port in 20000-32000")
}

#[test]
fn mpirun_with_ccl_root() {
    if no_mpirun() {
        return;
    }
    let secret: String = (0..16).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let root = format!("CCL_ROOT=127.0.0.1:{}", free_port());
    let o = run_open_mpi(
        Command::new("mpirun")
            .args(["--oversubscribe", "-np", "4", "-x", &root, "-x", &format!("CCL_SECRET={secret}"), "-x"])
            .args(["CCL_TIMEOUT=120", MATRIX]),
    )
    .expect("mpirun");
    correct(&o, 4);
    // without a rendezvous, every rank says what to set
    let o = run_open_mpi(Command::new("mpirun").args(["--oversubscribe", "-np", "2", MATRIX])).expect("mpirun");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("started by Open MPI as rank 1 of 2, but no rendezvous is given: set CCL_ROOT"), "{err}");
}

#[test]
fn cclrun_via_mpirun() {
    if no_mpirun() {
        return;
    }
    let via = ["--via", "mpirun", "--oversubscribe", "-np"];
    let o =
        run_open_mpi(Command::new(cclrun()).args(via).args(["3", "-x", "CCL_TIMEOUT=120", MATRIX])).expect("cclrun");
    correct(&o, 3);
    // a failing rank fails the job
    let failing = ["2", "sh", "-c", "exit $OMPI_COMM_WORLD_RANK"];
    let o = run_open_mpi(Command::new(cclrun()).args(via).args(failing)).expect("cclrun");
    assert!(!o.status.success());
}

#[test]
fn via_dry_run_shows_the_command() {
    let hosts = std::env::temp_dir().join(format!("ccl-via-hosts-{}", std::process::id()));
    std::fs::write(&hosts, "a slots=2\nb slots=2\n").expect("write");
    let h = hosts.to_string_lossy();
    let o = Command::new(cclrun())
        .args([
            "--via",
            "srun",
            "--dry-run",
            "-np",
            "4",
            "--map-by",
            "node",
            "--hostfile",
            &h,
            "-x",
            "OMP_NUM_THREADS=2",
        ])
        .args(["./app", "--n", "1"])
        .env_remove("CCL_DEBUG")
        .output()
        .expect("cclrun");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        out.starts_with(
            "CCL_UNIQUE_ID=<set by cclrun> srun --ntasks 4 --distribution cyclic --nodelist a,b --export ALL,CCL_UNIQUE_ID,"
        ) && out.trim_end().ends_with("OMP_NUM_THREADS ./app --n 1"),
        "{out}"
    );
    let o = Command::new(cclrun())
        .args(["--via", "mpirun", "--dry-run", "-np", "4", "--hostfile", &h, "./app"])
        .output()
        .expect("cclrun");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(&format!("mpirun -np 4 --hostfile {h} --map-by slot -x CCL_UNIQUE_ID")), "{out}");
    let _ = std::fs::remove_file(hosts);
}
