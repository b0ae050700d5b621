//! The fault suite: each scenario runs through cclrun, then checks that
//! every surviving rank ended with the expected error within the bound,
//! that cclrun's exit code and message are right, and that no process or
//! shared-memory file of the job is left. Prints a summary table
//! (`cargo test -p ccl-integration --test faults -- --nocapture`).

use ccl_integration::cclrun;
use std::process::Command;
use std::time::{Duration, Instant};

const FAULT: &str = env!("CARGO_BIN_EXE_fault");

struct Scenario {
    name: &'static str,
    ranks: usize,
    args: Vec<&'static str>,
    exit: i32,
    /// Every surviving rank's error contains one of these.
    errors: &'static [&'static str],
    /// cclrun's own report contains this.
    report: &'static str,
    bound: Duration,
}

fn scenarios() -> Vec<Scenario> {
    let s = |name, ranks, args: &[&'static str], exit, errors, report, secs| Scenario {
        name,
        ranks,
        args: args.to_vec(),
        exit,
        errors,
        report,
        bound: Duration::from_secs(secs),
    };
    let mut v = Vec::new();
    for (transport, x) in [("shm", "CCL_SHM_DISABLE=0"), ("tcp", "CCL_SHM_DISABLE=1")] {
        for ranks in [2, 4, 8] {
            let name = if transport == "shm" {
                "kill -9 a rank mid all_reduce (shm)"
            } else {
                "kill -9 a rank mid all_reduce (tcp)"
            };
            // every survivor names the killed rank, directly or as the root cause of a
            // cascade; over tcp a rank whose writes hit a peer that already left sees
            // only the broken pipe (no notice can travel against the data flow)
            let errors: &[&str] =
                if transport == "shm" { &["lost rank 1 "] } else { &["lost rank 1 ", "Broken pipe", "reset"] };
            v.push(s(name, ranks, &["-x", x, FAULT, "kill", "1"], 137, errors, "was killed by signal 9", 10));
        }
        let stop = if transport == "shm" { "SIGSTOP a rank (shm)" } else { "SIGSTOP a rank (tcp)" };
        v.push(s(
            stop,
            3,
            &["-x", x, "-x", "CCL_TIMEOUT=2", FAULT, "stop", "2"],
            1,
            &["timed out after", "lost rank"],
            "exited with code 1",
            15,
        ));
        let mm = if transport == "shm" { "mismatched collective (shm)" } else { "mismatched collective (tcp)" };
        v.push(s(
            mm,
            3,
            &["-x", x, "-x", "CCL_TIMEOUT=5", FAULT, "mismatch", "1"],
            1,
            &["but the peer called", "lost rank", "timed out"],
            "exited with code 1",
            15,
        ));
    }
    // RDMA through the software provider: a killed peer ends its queue
    // pairs' connections, or its setup pair, and survivors name it; as over
    // tcp, a rank whose writes reach a peer that already left (failing
    // because of rank 1) finds only that its writes went unanswered
    for ranks in [2, 4, 8] {
        let soft = ["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_IB_SOFT=1", FAULT, "kill", "1"];
        let errors: &[&str] = &["lost rank 1 ", "retry counter exceeded (the peer did not answer)"];
        v.push(s("kill -9 a rank mid all_reduce (rdma)", ranks, &soft, 137, errors, "was killed by signal 9", 10));
    }
    // what a NIC's errors do: the provider corrupts rank 1's 40th write's
    // rkey, or forces that write's queue pair to error; its two ends fail
    // naming each other (the refused write as a remote access error, the
    // other end's queue pair flushed), the rest hear of the lost rank
    for ranks in [2, 4] {
        let rkey = [
            "-x",
            "CCL_SHM_DISABLE=1",
            "-x",
            "CCL_IB_SOFT=1",
            "-x",
            "CCL_IB_SOFT_FAULT=rkey:1:40",
            FAULT,
            "loop",
            "20",
        ];
        let errors: &[&str] = &["remote access error", "flushed (the queue pair is in error)", "lost rank"];
        v.push(s("a corrupted rkey (rdma)", ranks, &rkey, 1, errors, "exited with code 1", 10));
        let error = [
            "-x",
            "CCL_SHM_DISABLE=1",
            "-x",
            "CCL_IB_SOFT=1",
            "-x",
            "CCL_IB_SOFT_FAULT=error:1:40",
            FAULT,
            "loop",
            "20",
        ];
        let errors: &[&str] = &["flushed (the queue pair is in error)", "lost rank"];
        v.push(s("a queue pair forced to error (rdma)", ranks, &error, 1, errors, "exited with code 1", 10));
    }
    v.push(s("a rank exits 3", 4, &[FAULT, "exit", "2", "3"], 3, &["lost rank 2 "], "exited with code 3", 10));
    // the survivors' GPUs wait on the gone rank's flags: the host's watch
    // releases them (a survivor may find first another that already left
    // with its error: each names the peer it waited on)
    let gone: &[&str] = &[
        "the GPU waited on a peer that is gone (peer 1: lost rank 1 ",
        "(peer 0: lost rank 0 ",
        "peer 2's device work was released",
        "peer 1: GPU: cannot map another process's emulated GPU memory (/proc/",
    ];
    v.push(s("a rank exits while GPUs wait on it", 3, &[FAULT, "gpu-exit", "1"], 3, gone, "exited with code 3", 15));
    v
}

/// The pids of this user's processes running `exe` (to find leftovers).
fn running(exe: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(link) = std::fs::read_link(e.path().join("exe")) {
            if link.to_string_lossy().trim_end_matches(" (deleted)") == exe {
                pids.push(pid);
            }
        }
    }
    pids
}

#[test]
fn fault_suite() {
    let before = running(FAULT);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for sc in scenarios() {
        let np = sc.ranks.to_string();
        let t = Instant::now();
        let o = Command::new(cclrun()).args(["-np", &np]).args(&sc.args).output().expect("cclrun");
        let took = t.elapsed();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        let rank_errors: Vec<&str> = err.lines().filter(|l| l.contains(" error: ")).collect();
        let survivors_ok =
            !rank_errors.is_empty() && rank_errors.iter().all(|l| sc.errors.iter().any(|e| l.contains(e)));
        let ok = o.status.code() == Some(sc.exit) && err.contains(sc.report) && survivors_ok && took < sc.bound;
        rows.push(format!(
            "| {:<38} | {:>5} | {:>4} | {:>12} | {:>6.2} s |",
            sc.name,
            sc.ranks,
            o.status.code().map_or("sig".into(), |c| c.to_string()),
            if ok { "right error" } else { "WRONG" },
            took.as_secs_f64()
        ));
        if !ok {
            failures.push(format!(
                "{} ({} ranks): exit {:?}, took {took:?}\n{err}",
                sc.name,
                sc.ranks,
                o.status.code()
            ));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let left: Vec<u32> = running(FAULT).into_iter().filter(|p| !before.contains(p)).collect();
    let shm_left = std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ccl-"))
        .count();
    println!("| {:<38} | ranks | exit | outcome      | to error |", "scenario");
    println!("|{}|-------|------|--------------|----------|", "-".repeat(40));
    for r in &rows {
        println!("{r}");
    }
    println!("leftover rank processes: {}, leftover shm files: {shm_left}", left.len());
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
    assert!(left.is_empty(), "ranks left running: {left:?}");
}

/// The ranks cclrun `launcher` started, by pid.
fn children(launcher: u32) -> Vec<u32> {
    running(FAULT)
        .into_iter()
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat.rsplit_once(") ").and_then(|(_, r)| r.split(' ').nth(1)?.parse::<u32>().ok());
            ppid == Some(launcher)
        })
        .collect()
}

/// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_none_or(|(_, r)| r.starts_with('Z') || r.starts_with('X'))
}

/// A rank killed while cclrun is stopped stays a zombie, which a check by
/// `kill(pid, 0)` took for alive: its peers must still find it gone (not
/// wait for CCL_TIMEOUT), and cclrun, continued, must report it; a
/// cclrun stopped past its `--timeout` ends the job once continued.
#[test]
fn a_stopped_cclrun_hides_no_dead_rank_and_keeps_its_timeout() {
    use std::io::BufRead;
    use std::process::Stdio;
    let signal = |pid: u32, sig| {
        // SAFETY: signalling a process this test started (or its child).
        unsafe { libc::kill(pid as i32, sig) };
    };
    let mut job = Command::new(cclrun())
        .args(["-np", "3", "-x", "CCL_TIMEOUT=60", FAULT, "loop", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cclrun");
    let mut out = std::io::BufReader::new(job.stdout.take().expect("stdout"));
    let mut line = String::new();
    while out.read_line(&mut line).is_ok_and(|n| n > 0) && !line.contains("looping") {
        line.clear();
    }
    let ranks = children(job.id());
    assert_eq!(ranks.len(), 3, "ranks of cclrun {}: {ranks:?}", job.id());
    signal(job.id(), libc::SIGSTOP);
    let t = Instant::now();
    signal(ranks[1], libc::SIGKILL);
    let others = [ranks[0], ranks[2]];
    while !others.iter().all(|&p| ended(p)) && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let found_in = t.elapsed();
    signal(job.id(), libc::SIGCONT);
    let o = job.wait_with_output().expect("cclrun");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(found_in < Duration::from_secs(30), "the peers still wait after {found_in:?}:\n{err}");
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("lost rank 1 "), "{err}");

    // stopped past its --timeout, then continued: the job ends at once
    let job = Command::new(cclrun())
        .args(["-np", "2", "--timeout", "2", FAULT, "loop", "120"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cclrun");
    std::thread::sleep(Duration::from_millis(500));
    signal(job.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    signal(job.id(), libc::SIGCONT);
    let t = Instant::now();
    let o = job.wait_with_output().expect("cclrun");
    assert_eq!(o.status.code(), Some(124), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(t.elapsed() < Duration::from_secs(15), "ended {:?} after it went on", t.elapsed());
}

/// Ranks that end as soon as their last call returns: a peer still in
/// that call has their data, and must finish it rather than find them
/// gone (over shared memory and TCP alike), every time.
#[test]
fn ranks_ending_right_after_their_last_call_fail_no_peer() {
    let mut failures = Vec::new();
    // an all-reduce, then a broadcast whose root leaves first
    let cases = [["check", "1048576"], ["bcast", "4194304"]];
    for x in ["CCL_SHM_DISABLE=0", "CCL_SHM_DISABLE=1"] {
        for run in 0..12 {
            let o = Command::new(cclrun())
                .args(["-np", "4", "-x", x, "-x", "CCL_TIMEOUT=60", FAULT])
                .args(cases[run % 2])
                .output()
                .expect("cclrun");
            let checked = String::from_utf8_lossy(&o.stdout).matches("checked").count();
            if !o.status.success() || checked != 4 {
                failures.push(format!(
                    "{x}, run {run}: exit {:?}, {checked} checked\n{}",
                    o.status.code(),
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}
