//! Every example binary runs and succeeds as a lone process (a world of
//! one); integration/tests/examples.rs runs them through cclrun at np 2..4.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).env_remove("CCL_RANK").output().expect("start example");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{bin} failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn bench_threads_checks_every_size() {
    let out = run(env!("CARGO_BIN_EXE_bench_threads"), &["3", "65536"]);
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 7, "8 B to 64 KiB by 4x: {out}");
    assert!(rows.iter().all(|r| r.trim_end().ends_with(" 0")), "no wrong elements: {out}");
}

#[test]
fn lone_examples() {
    assert!(run(env!("CARGO_BIN_EXE_hello"), &[]).contains("rank 0 of 1"));
    run(env!("CARGO_BIN_EXE_custom_op"), &[]);
    assert!(run(env!("CARGO_BIN_EXE_train_step"), &[]).contains("identical on all 1 ranks: true"));
    let perf = run(env!("CARGO_BIN_EXE_ccl-perf"), &["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1"]);
    assert!(perf.contains("# Out of bounds values : 0 OK"), "{perf}");
}

#[test]
fn ccl_sim_reads_every_shipped_topology() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccl/topologies");
    let mut seen = 0;
    for f in std::fs::read_dir(&dir).expect("topologies").flatten() {
        let path = f.path().to_string_lossy().into_owned();
        let out = run(env!("CARGO_BIN_EXE_ccl-sim"), &[&path, "-b", "8", "-e", "64M", "-f", "64"]);
        let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 4, "{path}: 8 B .. 2 MiB by 64x: {out}");
        // every row names the pick, one of the algorithms of the header
        for r in rows {
            let pick = r.split_whitespace().rev().nth(1).unwrap_or("");
            assert!(["ring", "tree", "rd", "rhd", "ring-ring", "tree-ring"].contains(&pick), "{r}");
        }
        seen += 1;
    }
    assert!(seen >= 4, "{seen} topology files");
    let bad = Command::new(env!("CARGO_BIN_EXE_ccl-sim")).args(["/no/such.toml"]).output().expect("ccl-sim");
    assert_eq!(bad.status.code(), Some(2));
}
