//! Every example through cclrun at 2, 3 and 4 ranks, and ccl-perf's table.

use ccl_integration::cclrun;
use std::path::PathBuf;
use std::process::Command;

fn bin(name: &str) -> PathBuf {
    cclrun().with_file_name(name)
}

fn run(np: usize, name: &str, args: &[&str]) -> String {
    let o = Command::new(cclrun()).arg("-np").arg(np.to_string()).arg(bin(name)).args(args).output().expect("cclrun");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{name} at np {np}: {out}\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn examples_at_2_to_4_ranks() {
    for np in 2..=4 {
        assert_eq!(run(np, "hello", &[]).matches(&format!("of {np} on")).count(), np);
        assert_eq!(run(np, "custom_op", &[]).lines().count(), np);
        let a = run(np, "async_overlap", &[]);
        assert_eq!(a.matches("sums right: true").count(), np, "{a}");
        let t = run(np, "train_step", &[]);
        assert_eq!(t.matches(&format!("identical on all {np} ranks: true")).count(), np, "{t}");
    }
}

#[test]
fn ccl_perf_prints_the_nccl_tests_table_with_real_checks() {
    let json = std::env::temp_dir().join(format!("ccl-perf-{}.json", std::process::id()));
    let colls = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"];
    let more = ["gather", "scatter", "scan", "exscan", "sendrecv", "halo"];
    let varying = ["all_gatherv", "reduce_scatterv", "all_to_allv", "gatherv", "scatterv"];
    for coll in colls.into_iter().chain(more).chain(varying) {
        let out = run(
            3,
            "ccl-perf",
            &[
                "-C",
                coll,
                "-b",
                "8",
                "-e",
                "256K",
                "-f",
                "8",
                "-n",
                "3",
                "-w",
                "1",
                "-d",
                "int32",
                "--json",
                json.to_str().unwrap_or(""),
            ],
        );
        assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
        assert!(out.contains("# Avg bus bandwidth"), "{out}");
        let rows = out.lines().filter(|l| !l.starts_with('#')).count();
        // 8 B .. 256 KiB by 8 (sizes rounded to whole blocks of 3 ranks)
        assert!((5..=6).contains(&rows), "{out}");
        let doc = std::fs::read_to_string(&json).expect("json written");
        assert!(doc.contains(&format!("\"coll\": \"{coll}\"")), "{doc}");
    }
    let _ = std::fs::remove_file(json);
}

#[test]
fn ccl_perf_socket_backend_and_memcpy_yardstick() {
    let json = std::env::temp_dir().join(format!("socket-{}.json", std::process::id()));
    let json_arg = json.to_string_lossy().into_owned();
    let out = run(
        2,
        "ccl-perf",
        &["--backend", "socket", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "--json", &json_arg],
    );
    let doc = std::fs::read_to_string(&json).expect("json written");
    assert!(doc.contains("\"backend\": \"raw TCP\"") && doc.contains("\"size\": 32768"), "{doc}");
    let _ = std::fs::remove_file(json);
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(rows.iter().all(|r| r.split_whitespace().nth(6).and_then(|b| b.parse::<f64>().ok()).is_some()), "{out}");
    let out = run(2, "ccl-perf", &["-b", "1M", "-e", "1M", "-n", "2", "-w", "1"]);
    assert!(out.contains("# memcpy: 2 rank(s) each copying 1 MiB at once: "), "{out}");
    let o = Command::new(bin("ccl-perf")).args(["--backend", "nope"]).output().expect("ccl-perf");
    assert_eq!(o.status.code(), Some(2));
    // NCCL needs its feature (and libnccl at run time): a message and exit 2, never a panic
    let o = Command::new(bin("ccl-perf")).args(["--backend", "nccl", "-b", "8", "-e", "8"]).output().expect("ccl-perf");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.contains("--backend nccl needs a build with `--features nccl`"), "{err}");
}

#[test]
fn ccl_perf_on_an_emulated_gpu_prints_host_times_and_the_copy_ceiling() {
    let out = run(2, "ccl-perf", &["--device", "emulated", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "-w", "1"]);
    assert!(out.contains("# device-to-device copy of 65536 B: ") && out.contains("(the ceiling for busbw)"), "{out}");
    let head = out.lines().find(|l| l.contains("#wrong")).unwrap_or_default();
    assert_eq!(head.matches("host").count(), 2, "a host column per mode: {out}");
    let rows: Vec<Vec<&str>> =
        out.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 3, "{out}");
    for r in rows {
        // size count type redop root | time algbw busbw #wrong host | the same in place
        assert_eq!(r.len(), 15, "{r:?}");
        assert!(r[8] == "0" && r[13] == "0", "no wrong elements: {r:?}");
        let (time, host) = (r[5].parse::<f64>().unwrap_or(-1.0), r[9].parse::<f64>().unwrap_or(-1.0));
        assert!(time > 0.0 && host > 0.0, "{r:?}");
    }
}

#[test]
fn ccl_perf_warms_up_for_a_time_with_its_own_backend_only() {
    let out = run(2, "ccl-perf", &["-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "--warmup_ms", "5"]);
    assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 4, "{out}");
    assert!(out.contains("1 warmup and 5 ms"), "{out}");
    for args in [&["--warmup_ms=-1"][..], &["--warmup_ms", "NaN"], &["--backend", "socket", "--warmup_ms", "5"]] {
        let o = Command::new(bin("ccl-perf")).args(args).output().expect("ccl-perf");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.code() == Some(2) && err.contains("--warmup_ms"), "{args:?}: {err}");
    }
}

#[test]
fn ccl_perf_on_shared_buffers_checks_every_collective() {
    // 64-256 KiB on 3 ranks with algorithm direct forced: the calls that can
    // take shared buffers directly do so (CCL_DEBUG=INFO names them); the
    // others use them as ordinary memory (when the tuner chooses direct is
    // for ccl's own tests, on a fixed model)
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"] {
        let o = Command::new(cclrun())
            .args(["-np", "3", "-x", "CCL_DEBUG=INFO", "-x", "CCL_ALGO=direct"])
            .arg(bin("ccl-perf"))
            .args(["--shared", "-C", coll, "-b", "64K", "-e", "256K", "-f", "4", "-n", "3", "-w", "1", "-d", "int32"])
            .output()
            .expect("cclrun");
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success() && out.contains("# Out of bounds values : 0 OK"), "{coll}: {out}\n{err}");
        let direct = err.contains(&format!("{coll} #")) && err.contains("directly through shared memory");
        assert_eq!(direct, !matches!(coll, "reduce" | "all_to_all"), "{coll}: {err}");
    }
}
