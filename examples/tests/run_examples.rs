//! Every example binary runs and succeeds.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().expect("start example");
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
fn custom_op() {
    run(env!("CARGO_BIN_EXE_custom_op"), &[]);
}

#[test]
fn train_step() {
    run(env!("CARGO_BIN_EXE_train_step"), &[]);
}
