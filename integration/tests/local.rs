//! cclrun on this host: the collective matrix as processes over shared
//! memory, failures, signals, and bad command lines.

use ccl_integration::cclrun;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MATRIX: &str = env!("CARGO_BIN_EXE_coll_matrix");
const FAULT: &str = env!("CARGO_BIN_EXE_fault");

fn run(args: &[&str]) -> Output {
    Command::new(cclrun()).args(args).output().expect("start cclrun")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

fn matrix(np: usize, extra: &[&str]) {
    ccl_integration::every_rank_passes(np, extra, &[MATRIX], "all collectives correct");
}

#[test]
fn matrix_over_shm_2_3_4_ranks() {
    for np in [2, 3, 4] {
        matrix(np, &[]);
    }
}

#[test]
fn matrix_over_shm_every_algorithm() {
    for algo in ["ring", "tree", "rd", "rhd", "ring-ring", "tree-ring"] {
        matrix(3, &["-x", &format!("CCL_ALGO={algo}")]);
    }
}

#[test]
fn matrix_over_tcp_2_3_4_ranks() {
    for np in [2, 3, 4] {
        matrix(np, &["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_TEST_LARGE=1"]);
    }
    // many small slots: sends from the call's buffers pile up behind the socket
    matrix(2, &["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_TEST_LARGE=1", "-x", "CCL_BUFFSIZE=8K"]);
    matrix(3, &["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_SOCKETS_PER_PEER=1"]);
    matrix(2, &["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_SOCKETS_PER_PEER=4", "-x", "CCL_SOCKET_IFNAME=lo"]);
    matrix(3, &["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_CHECKSUM=1"]);
}

/// RDMA through the software provider, ranks of this host kept off
/// shared memory.
const SOFT_RDMA: [&str; 4] = ["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_IB_SOFT=1"];

#[test]
fn matrix_over_soft_rdma_2_to_8_ranks_and_channels() {
    for np in [2, 4, 8] {
        matrix(np, &SOFT_RDMA);
    }
    matrix(3, &[&SOFT_RDMA[..], &["-x", "CCL_TEST_LARGE=1", "-x", "CCL_NCHANNELS=2"]].concat());
    // small slots: many messages wait for credits
    matrix(2, &[&SOFT_RDMA[..], &["-x", "CCL_TEST_LARGE=1", "-x", "CCL_BUFFSIZE=8K"]].concat());
    // each connection over 3 queue pairs
    matrix(3, &[&SOFT_RDMA[..], &["-x", "CCL_TEST_LARGE=1", "-x", "CCL_IB_QPS_PER_CONNECTION=3"]].concat());
}

#[test]
fn matrix_over_soft_rdma_every_algorithm() {
    for algo in ["ring", "tree", "rd", "rhd", "ring-ring", "tree-ring"] {
        matrix(3, &[&SOFT_RDMA[..], &["-x", "CCL_TEST_LARGE=1", "-x", &format!("CCL_ALGO={algo}")]].concat());
    }
}

#[test]
fn matrix_over_tcp_every_algorithm() {
    for algo in ["ring", "tree", "rd", "rhd", "ring-ring", "tree-ring"] {
        matrix(3, &["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_TEST_LARGE=1", "-x", &format!("CCL_ALGO={algo}")]);
    }
}

#[test]
fn a_rank_killed_mid_all_reduce_over_tcp_is_reported_by_the_others() {
    let o = run(&["-np", "3", "-x", "CCL_SHM_DISABLE=1", FAULT, "kill", "1"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(137), "{err}");
    assert!(err.contains("lost rank 1"), "{err}");
    assert_eq!(err.matches(": lost rank ").count(), 2, "{err}");
}

#[test]
fn a_failing_rank_sets_the_exit_code_and_names_itself() {
    let o = run(&["-np", "3", FAULT, "exit", "1", "3"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("cclrun: rank 1 (pid"), "{err}");
    assert!(err.contains("exited with code 3"), "{err}");
    assert!(err.contains("lost rank 1"), "survivors name the lost peer: {err}");
}

#[test]
fn a_rank_killed_mid_all_reduce_ends_the_job_with_137() {
    let t = Instant::now();
    let o = run(&["-np", "3", FAULT, "kill", "2"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(137), "{err}");
    assert!(err.contains("rank 2") && err.contains("SIGKILL"), "{err}");
    // every survivor ends with a lost peer: rank 2, or a rank that already left because of it
    assert_eq!(err.matches(" error: ").count(), 2, "both survivors report an error: {err}");
    assert_eq!(err.matches(": lost rank ").count(), 2, "{err}");
    assert!(err.contains("lost rank 2"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30));
}

#[test]
fn mismatched_calls_end_the_job_with_both_calls_named() {
    for transport in ["CCL_SHM_DISABLE=0", "CCL_SHM_DISABLE=1"] {
        let o = run(&["-np", "3", "-x", transport, "-x", "CCL_TIMEOUT=20", FAULT, "mismatch", "1"]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("but the peer called"), "{transport}: {err}");
        assert!(err.contains("broadcast(262144 × f32 of 4 B, root 0) #0"), "{transport}: {err}");
        assert!(err.contains("all_reduce(262144 × f32 of 4 B, sum) #0"), "{transport}: {err}");
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Starts `fault hang` on 2 ranks; returns cclrun and the ranks' pids.
fn hanging_job() -> (std::process::Child, Vec<i32>) {
    let mut c = Command::new(cclrun())
        .args(["-np", "2", FAULT, "hang"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    let mut out = std::io::BufReader::new(c.stdout.take().expect("stdout"));
    let mut pids = Vec::new();
    while pids.len() < 2 {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut out, &mut line).expect("read") == 0 {
            break;
        }
        if let Some(p) = line.trim().strip_prefix("pid ") {
            pids.push(p.parse().expect("pid"));
        }
    }
    assert_eq!(pids.len(), 2);
    (c, pids)
}

fn gone_soon(pids: &[i32]) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if pids.iter().all(|&p| !alive(p)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn ctrl_c_reaches_every_rank() {
    let (mut c, pids) = hanging_job();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let st = c.wait().expect("wait");
    assert_eq!(st.code(), Some(130));
    assert!(gone_soon(&pids));
}

#[test]
fn ranks_do_not_outlive_a_killed_cclrun() {
    let (mut c, pids) = hanging_job();
    c.kill().expect("SIGKILL cclrun");
    let _ = c.wait();
    assert!(gone_soon(&pids), "ranks {pids:?} outlived cclrun");
}

#[test]
fn a_missing_or_non_executable_program_exits_127() {
    let o = run(&["-np", "2", "/no/such/program"]);
    assert_eq!(o.status.code(), Some(127));
    assert_eq!(text(&o).1.trim(), "cclrun: /no/such/program: no such file");
    let o = run(&["-np", "2", "no-such-command-anywhere"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(text(&o).1.contains("command not found"));
    let plain = std::env::temp_dir().join(format!("cclrun-plain-{}", std::process::id()));
    std::fs::write(&plain, "not a program").expect("write");
    let o = run(&["-np", "1", plain.to_str().unwrap_or("")]);
    let _ = std::fs::remove_file(&plain);
    assert_eq!(o.status.code(), Some(127));
    assert!(text(&o).1.contains("not an executable file"), "{}", text(&o).1);
}

#[test]
fn bad_hostfiles_and_slot_counts_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("cclrun-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let hf = dir.join("hosts");
    std::fs::write(&hf, "localhost slots=2\nlocalhost:3\n").expect("write");
    let o = run(&["-np", "2", "--hostfile", hf.to_str().unwrap_or(""), "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("hosts:2: host localhost is listed twice"), "{}", text(&o).1);
    std::fs::write(&hf, "localhost slots=2\n").expect("write");
    let o = run(&["-np", "3", "--hostfile", hf.to_str().unwrap_or(""), "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("--oversubscribe"));
    let o = run(&["-np", "3", "--oversubscribe", "--hostfile", hf.to_str().unwrap_or(""), "true"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let o = run(&["-np", "2", "-H", "elsewhere.invalid:2", "true"]);
    assert_eq!(o.status.code(), Some(255));
    assert!(text(&o).1.contains("host elsewhere.invalid: cannot resolve"), "{}", text(&o).1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tag_output_and_exported_variables() {
    let o =
        run(&["-np", "3", "--tag-output", "-x", "GREETING=hi", "sh", "-c", "echo $GREETING $CCL_RANK $CCL_LOCAL_SIZE"]);
    assert!(o.status.success());
    let mut lines: Vec<String> = text(&o).0.lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines, vec!["[0] hi 0 3", "[1] hi 1 3", "[2] hi 2 3"]);
}

/// The CPUs the kernel lets this process use, as `/proc/self/status` lists them.
fn cpus_allowed_here() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list").trim().to_string()
}

/// Expands a CPU list such as `0-2,5` into `[0, 1, 2, 5]`.
fn cpu_list(s: &str) -> Vec<usize> {
    let num = |x: &str| x.trim().parse::<usize>().expect("cpu number");
    s.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => (num(a)..=num(b)).collect::<Vec<_>>(),
            None => vec![num(part)],
        })
        .collect()
}

#[test]
fn bind_to_core_pins_in_local_rank_order_none_leaves_ranks_and_auto_pins_only_even_oversubscription() {
    let allowed = cpu_list(&cpus_allowed_here());
    let show = ["--tag-output", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"];
    let per_rank_of = |np: usize, bind: Option<&str>| -> Vec<Vec<usize>> {
        let np_s = np.to_string();
        let mut args = vec!["-np", &np_s, "--oversubscribe"];
        if let Some(b) = bind {
            args.extend(["--bind-to", b]);
        }
        args.extend(show);
        let o = run(&args);
        assert!(o.status.success(), "{:?}", text(&o));
        let mut got = vec![Vec::new(); np];
        for line in text(&o).0.lines() {
            let (rank, list) = line.split_once("] Cpus_allowed_list:").expect("tagged line");
            got[rank.trim_start_matches('[').parse::<usize>().expect("rank")] = cpu_list(list.trim());
        }
        got
    };
    // one CPU each while there are enough; beyond, contiguous blocks, so
    // that neighbouring ranks share a CPU (2 CPUs: ranks 0-1 on the
    // first and 2 on the second of 3, 0-1 and 2-3 of 4)
    for np in [allowed.len(), allowed.len() + 1, 2 * allowed.len()] {
        for (r, cpus) in per_rank_of(np, Some("core")).iter().enumerate() {
            assert_eq!(cpus, &vec![allowed[r * allowed.len() / np]], "rank {r} of {np}");
        }
    }
    let np = allowed.len() + 1;
    for (r, cpus) in per_rank_of(np, Some("none")).iter().enumerate() {
        assert_eq!(cpus, &allowed, "rank {r} unpinned");
    }
    // by default (auto) not at all while every rank could have a CPU of its
    // own (jobs side by side would share the first ones), nor beyond where
    // the ranks do not split evenly over the CPUs; as `core` where they do
    for np in [allowed.len(), 2 * allowed.len() + 1] {
        for (r, cpus) in per_rank_of(np, None).iter().enumerate() {
            assert_eq!(cpus, &allowed, "rank {r} of {np} by default");
        }
    }
    let np = 2 * allowed.len();
    for bind in [None, Some("auto")] {
        for (r, cpus) in per_rank_of(np, bind).iter().enumerate() {
            assert_eq!(cpus, &vec![allowed[r * allowed.len() / np]], "rank {r} of {np}, {bind:?}");
        }
    }
    // a pinned rank sees one CPU; cclrun tells it how many the host gives the job
    let o = run(&["-np", "1", "--bind-to", "core", "sh", "-c", "echo $CCL_HOST_CPUS"]);
    assert_eq!(text(&o).0.trim(), allowed.len().to_string());
    let bad = run(&["-np", "1", "--bind-to", "socket", "true"]);
    assert_eq!(bad.status.code(), Some(2), "an unknown binding is a usage error");
}

#[test]
fn job_timeout_ends_everything_with_124() {
    let o = run(&["-np", "2", "--timeout", "1", FAULT, "hang"]);
    assert_eq!(o.status.code(), Some(124));
    assert!(text(&o).1.contains("timed out"));
}

#[test]
fn sigusr1_makes_a_stuck_rank_print_what_it_waits_for() {
    use std::io::BufRead;
    let mut c = Command::new(cclrun())
        .args(["-np", "2", FAULT, "stuck"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let mut out = std::io::BufReader::new(c.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("pid line");
    let pid: i32 = line.trim().strip_prefix("pid ").and_then(|p| p.parse().ok()).expect("pid");
    let (tx, rx) = std::sync::mpsc::channel();
    let err = c.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling rank 0, a process of this test's job.
    unsafe { libc::kill(pid, libc::SIGUSR1) };
    let dumped = rx.recv_timeout(Duration::from_secs(10));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let _ = c.wait();
    let dumped = dumped.expect("a dump line within 10 s");
    assert!(dumped.starts_with("ccl: rank 0 on SIGUSR1: all_reduce #0 pending for "), "{dumped}");
    assert!(dumped.contains("waiting to receive from rank 1"), "{dumped}");
}

/// SIGTERM while cclrun is still starting a large job: it stops starting
/// ranks, ends those started, removes the job's shm files and exits 143.
#[test]
fn a_signal_while_ranks_start_ends_the_job_cleanly() {
    let mut c = Command::new(cclrun())
        .args(["-np", "600", "--oversubscribe", FAULT, "hang"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start cclrun");
    std::thread::sleep(Duration::from_millis(400));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let launcher = c.id();
    let st = c.wait().expect("wait");
    assert_eq!(st.code(), Some(143));
    let deadline = Instant::now() + Duration::from_secs(20);
    // this job's ranks only: other tests run `fault hang` jobs alongside
    let ours = format!("CCL_LAUNCHER_PID={launcher}");
    let fault_procs = || {
        std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_to_string(e.path().join("cmdline")).is_ok_and(|c| c.starts_with(FAULT))
                            && std::fs::read(e.path().join("environ"))
                                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == ours.as_bytes()))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    while fault_procs() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(fault_procs(), 0, "ranks outlived the job");
}
