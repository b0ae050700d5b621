//! cclrun across hosts: network namespaces with their own sshd (made by
//! scripts/cluster.sh), reached over SSH. The collective matrix, placement,
//! every bad input the cluster makes possible, and lost launchers and
//! hosts; after each, nothing may be left running on any host.
//! Needs root, sshd and iproute2; skips without them unless
//! CCL_TEST_REQUIRE_ALL=1.

use ccl_integration::cclrun;
use ccl_integration::cluster::Cluster;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const MATRIX: &str = env!("CARGO_BIN_EXE_coll_matrix");

fn run(c: &Cluster, args: &[&str]) -> Output {
    Command::new(cclrun()).args(c.args()).args(args).output().expect("start cclrun")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

/// Waits until `f` holds, for at most `secs`.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

fn assert_clean(c: &Cluster) {
    assert!(eventually(10, || c.strays().is_empty()), "left running: {:?}", c.strays());
}

#[test]
fn matrix_across_four_hosts() {
    let Some(c) = Cluster::up("matrix", 4, 2) else { return };
    // the last: RDMA between hosts through the software provider
    let extras: [&[&str]; 4] = [
        &[],
        &["-x", "CCL_ALGO=tree-ring"],
        &["--map-by", "node", "-x", "CCL_ALGO=ring-ring"],
        &["-x", "CCL_IB_SOFT=1"],
    ];
    for extra in extras {
        let mut args = vec!["-np", "8", "-x", "CCL_TIMEOUT=120"];
        args.extend_from_slice(extra);
        args.push(MATRIX);
        let o = run(&c, &args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{extra:?}: {err}");
        assert_eq!(out.matches("all collectives correct").count(), 8, "{out}");
    }
    assert_clean(&c);
}

#[test]
fn placement_and_topology_are_reported() {
    let Some(c) = Cluster::up("place", 4, 2) else { return };
    let show = "echo $CCL_RANK $CCL_HOSTID $CCL_LOCAL_RANK $CCL_LOCAL_SIZE";
    for (by, host_of) in [("slot", [1, 1, 2, 2, 3, 3, 4, 4]), ("node", [1, 2, 3, 4, 1, 2, 3, 4])] {
        let o = run(&c, &["-np", "8", "--map-by", by, "sh", "-c", show]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let mut lines: Vec<Vec<String>> =
            out.lines().map(|l| l.split_whitespace().map(String::from).collect()).collect();
        lines.sort_by_key(|w| w[0].parse::<usize>().unwrap_or(0));
        for (rank, w) in lines.iter().enumerate() {
            assert_eq!(w[0], rank.to_string());
            assert_eq!(w[1], format!("host{}", host_of[rank]), "--map-by {by}: {out}");
            assert_eq!(
                (w[2].as_str(), w[3].as_str()),
                (if by == "slot" { rank % 2 } else { rank / 4 }.to_string().as_str(), "2")
            );
        }
    }
    // CCL_DEBUG=INFO: the rank → host map, where outputs bypass the cache, and the
    // algorithm chosen across hosts
    let perf = cclrun().with_file_name("ccl-perf");
    let perf = perf.to_string_lossy();
    let o = run(&c, &["-np", "8", "-x", "CCL_DEBUG=INFO", &perf, "-b", "1M", "-e", "1M", "-n", "2", "-w", "1"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for r in 0..8 {
        assert!(err.contains(&format!("ccl INFO rank {r} on host{}", r / 2 + 1)), "{err}");
    }
    assert!(err.contains("ccl INFO network between hosts: "), "{err}");
    assert!(err.contains("ccl INFO outputs of ") && err.contains("written around the cache (auto: "), "{err}");
    assert!(err.contains("all_reduce 1 MiB class (first call 1048576 B) on 8 ranks / 4 hosts: "), "{err}");
    let (chosen, us, gbs) = choices(&err);
    assert!(chosen.iter().any(|(class, _)| class == "1 MiB") && us > 0.0 && gbs > 0.0, "{err}");
    assert!(out.contains("1048576"), "{out}");
    assert_clean(&c);
}

#[test]
fn bad_input_names_the_host_and_starts_nothing() {
    let Some(c) = Cluster::up("bad", 3, 2) else { return };
    let hosts = c.hosts();
    let key = c.file("other-key");
    let st = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f", &key]).status();
    assert!(st.expect("ssh-keygen").success());
    std::fs::write(c.file("empty-known-hosts"), "").expect("write");
    let list = hosts.iter().map(|h| format!("{h}:2")).collect::<Vec<_>>().join(",");
    let this = cclrun();
    let ssh =
        |key: &str, known: &str| ["-H", &list, "--ssh-key", key, "--known-hosts", known].map(String::from).to_vec();
    let cases: Vec<(Vec<String>, i32, String)> = vec![
        (ssh(&key, &c.file("known_hosts")), 255, format!("host {}: authentication as root refused", hosts[1])),
        (ssh(&c.file("id"), &c.file("empty-known-hosts")), 255, format!("host {}: host key not in", hosts[2])),
        (
            ssh(&c.file("id"), &c.file("known_hosts")),
            127,
            format!("host {}: ./no-such-program: no such file", hosts[0]),
        ),
        (
            [ssh(&c.file("id"), &c.file("known_hosts")), vec!["--remote-cclrun".into(), "/no/cclrun".into()]].concat(),
            127,
            format!("host {}: cannot start `/no/cclrun agent`", hosts[1]),
        ),
        (
            vec!["-H".into(), format!("{}:2,nohost.invalid:4", hosts[0]), "--ssh-key".into(), c.file("id")],
            255,
            "host nohost.invalid: cannot resolve".into(),
        ),
    ];
    for (args, code, want) in cases {
        let prog = if want.contains("no-such-program") { "./no-such-program" } else { "true" };
        let o = Command::new(&this).args(["-np", "6"]).args(&args).arg(prog).output().expect("cclrun");
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(&want) && err.contains("no rank was started"), "{args:?}: want {want:?} in {err}");
        assert_clean(&c);
    }
    // too many ranks, a host listed twice: refused before connecting
    let o = run(&c, &["-np", "7", "true"]);
    assert!(text(&o).1.contains("7 ranks requested but the hosts have 6 slot(s)"), "{}", text(&o).1);
    std::fs::write(c.file("twice"), format!("{0}\n{0} slots=2\n", hosts[0])).expect("write");
    let o = Command::new(&this).args(["-np", "2", "--hostfile", &c.file("twice"), "true"]).output().expect("cclrun");
    assert!(text(&o).1.contains(&format!("host {} is listed twice", hosts[0])));
    // sshd down on one host
    // SAFETY: ending the sshd this test's cluster started, by its pid.
    unsafe { libc::kill(c.sshd_pid(2), libc::SIGTERM) };
    let o = run(&c, &["-np", "6", "true"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(err.contains(&format!("host {}: cannot connect to {}:22", hosts[1], hosts[1])), "{err}");
    assert_clean(&c);
}

#[test]
fn no_rank_outlives_a_lost_launcher_or_host() {
    let Some(c) = Cluster::up("lost", 4, 2) else { return };
    let sleeping = |c: &Cluster| c.strays().iter().filter(|s| s.contains("sleep 300")).count();
    // the launcher killed: every agent sees its channel close and ends its ranks
    let mut job = Command::new(cclrun()).args(c.args()).args(["-np", "8", "sleep", "300"]).spawn().expect("cclrun");
    assert!(eventually(20, || sleeping(&c) == 8), "{:?}", c.strays());
    job.kill().expect("kill cclrun");
    let _ = job.wait();
    assert_clean(&c);
    // one host's agent killed: cclrun reports the host and ends the others
    let job = Command::new(cclrun())
        .args(c.args())
        .args(["-np", "8", "sleep", "300"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cclrun");
    assert!(eventually(20, || sleeping(&c) == 8), "{:?}", c.strays());
    let agent = c.strays().into_iter().find(|s| s.contains("cclrun agent")).expect("an agent");
    let pid: i32 = agent.split_whitespace().next().and_then(|p| p.parse().ok()).expect("pid");
    // SAFETY: killing an agent this test's cclrun started, by its pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let o = job.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{err}");
    assert!(err.contains("the connection closed before its ranks ended; ending the job"), "{err}");
    assert_clean(&c);
}

/// The algorithm rank 0 chose per all_reduce size class, and the network
/// latency (us) and bandwidth (GB/s) it measured, from CCL_DEBUG=INFO.
fn choices(err: &str) -> (Vec<(String, String)>, f64, f64) {
    let mut out = Vec::new();
    let (mut us, mut gbs) = (0.0, 0.0);
    for l in err.lines() {
        if let Some(rest) = l.strip_prefix("ccl INFO network between hosts: ") {
            // "22.0 us, 0.13 GB/s (...)"
            let figure =
                |i: usize| rest.split(", ").nth(i).and_then(|b| b.split(' ').next()).and_then(|b| b.parse().ok());
            (us, gbs) = (figure(0).unwrap_or(0.0), figure(1).unwrap_or(0.0));
        }
        if let Some(rest) = l.strip_prefix("ccl INFO all_reduce ") {
            let class = rest.split(" class").next().unwrap_or("").to_string();
            let algo = rest.split("hosts: ").nth(1).and_then(|a| a.split(',').next()).unwrap_or("").to_string();
            // the fastest prediction is the one chosen
            let first = rest.split("predicted ").nth(1).and_then(|p| p.split(' ').next()).unwrap_or("");
            assert_eq!(algo, first, "{l}");
            out.push((class, algo));
        }
    }
    (out, us, gbs)
}

#[test]
fn shaped_links_change_the_choice_as_the_model_says() {
    let Some(c) = Cluster::up("shaped", 4, 2) else { return };
    let perf = cclrun().with_file_name("ccl-perf");
    let perf = perf.to_string_lossy();
    let mut runs = Vec::new();
    // sizes by factor 2: where recursive doubling gives way to ring-ring
    // moves with the links' latency × bandwidth, as measured at start-up.
    // With 8 ranks on 2 cores the latency measured is mostly waiting for a
    // sleeping rank to be woken: 16-140 us from run to run, shaped or not
    for rate in ["off", "1gbit"] {
        c.shape(rate);
        let o = run(
            &c,
            &["-np", "8", "-x", "CCL_DEBUG=INFO", &perf, "-b", "1K", "-e", "16M", "-f", "2", "-n", "2", "-w", "1"],
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        eprintln!("links {rate}:\n{out}");
        runs.push(choices(&err));
    }
    let ((fast, fast_us, fast_gbs), (slow, slow_us, slow_gbs)) = (&runs[0], &runs[1]);
    eprintln!(
        "unshaped ({fast_us} us, {fast_gbs} GB/s measured): {fast:?}\n\
         shaped to 1 Gbit/s ({slow_us} us, {slow_gbs} GB/s measured): {slow:?}"
    );
    assert!((0.08..0.16).contains(slow_gbs), "1 Gbit/s measured as {slow_gbs} GB/s");
    assert_eq!(slow.last().map(|c| c.1.as_str()), Some("ring-ring"), "{slow:?}");
    // the first size class given to ring-ring: earlier on the link whose
    // latency × bandwidth is clearly smaller (the shaped one, unless its
    // latency happened to be measured many times higher)
    let first_ring = |v: &[(String, String)]| v.iter().position(|(_, a)| a != "rd").unwrap_or(v.len());
    let (fast_from, slow_from) = (first_ring(fast), first_ring(slow));
    let (fast_ab, slow_ab) = (fast_us * fast_gbs, slow_us * slow_gbs);
    if slow_ab < fast_ab / 4.0 {
        assert!(slow_from < fast_from, "the choice did not follow the links: {fast:?} vs {slow:?}");
    } else if fast_ab < slow_ab / 4.0 {
        assert!(fast_from < slow_from, "the choice did not follow the links: {fast:?} vs {slow:?}");
    }
    assert_clean(&c);
}

#[test]
fn a_host_whose_link_goes_down_ends_the_job_with_errors() {
    use std::io::BufRead;
    let Some(c) = Cluster::up("linkdown", 4, 2) else { return };
    let fault = env!("CARGO_BIN_EXE_fault");
    let mut job = Command::new(cclrun())
        .args(c.args())
        .args(["-np", "8", "-x", "CCL_TIMEOUT=120", fault, "loop", "300"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cclrun");
    let mut out = std::io::BufReader::new(job.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "looping");
    let cut = Instant::now();
    c.link(3, false); // ranks 4 and 5 are on host 3
    let o = job.wait_with_output().expect("wait");
    let took = cut.elapsed();
    c.link(3, true);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("link down: cclrun exited {:?} after {:.1} s\n{err}", o.status.code(), took.as_secs_f64());
    assert!(!o.status.success(), "{err}");
    // every rank off host 3 ended with an error of its own, found by the
    // link's keepalive or a peer's notice, not by the 120 s call deadline
    for r in [0, 1, 2, 3, 6, 7] {
        assert!(err.contains(&format!("rank {r} error: ")), "rank {r} said nothing: {err}");
    }
    assert!(!err.contains("timed out after"), "a deadline, not the lost link, ended a call: {err}");
    assert!(err.contains("ending the job"), "{err}");
    assert!(eventually(60, || c.strays().is_empty()), "left running: {:?}", c.strays());
}

#[test]
fn roots_mismatched_across_hosts_fail_instead_of_hanging() {
    let Some(c) = Cluster::up("roots", 2, 2) else { return };
    let fault = env!("CARGO_BIN_EXE_fault");
    // every rank its own root: one rank a host, where a rank cannot read
    // its peer's calls but is told them; then two a host by node
    for (np, coll, count) in [("2", "reduce", "4"), ("2", "broadcast", "4194304"), ("4", "reduce", "1048576")] {
        let t = Instant::now();
        let args = ["-np", np, "--map-by", "node", "-x", "CCL_TIMEOUT=60", fault, "roots", coll, count];
        let o = run(&c, &args);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{np} ranks, {coll} {count}: {err}");
        assert!(err.contains("but the peer called") && err.contains(", root "), "{np} ranks, {coll} {count}: {err}");
        assert!(t.elapsed() < Duration::from_secs(40), "{coll} {count}: ended by the deadline: {err}");
    }
    assert_clean(&c);
}

#[test]
fn channels_spread_over_every_interface_socket_ifname_lists() {
    // two hosts of two ranks, each host with eth0 and eth1 on networks of
    // their own: with both named, the second channel's connections go over
    // eth1 (over TCP, and over RDMA by the software provider), and the
    // collective matrix is still right
    let Some(c) = Cluster::with_nics("nics", 2, 2, 2) else { return };
    let sent = |k| c.sent(1, k) + c.sent(2, k);
    let job = |ifnames: &str, extra: &[&str]| {
        let (before0, before1) = (sent(0), sent(1));
        let mut args = vec!["-np", "4", "-x", "CCL_TIMEOUT=120", "-x", "CCL_NCHANNELS=2", "-x", ifnames];
        args.extend_from_slice(extra);
        args.push(MATRIX);
        let o = run(&c, &args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{ifnames}: {err}");
        assert_eq!(out.matches("all collectives correct").count(), 4, "{out}");
        ((sent(0) - before0) as f64, (sent(1) - before1) as f64, err)
    };
    // one interface: eth1 carries nothing of the job's
    let (eth0, eth1, _) = job("CCL_SOCKET_IFNAME=eth0", &[]);
    assert!(eth0 > 1e6 && eth1 < 1e5, "eth0 sent {eth0} B, eth1 {eth1} B");
    // both: eth1 carries a share (its channel's) near eth0's
    let (eth0, eth1, _) = job("CCL_SOCKET_IFNAME=eth0,eth1", &[]);
    eprintln!("both interfaces: eth0 sent {eth0} B, eth1 {eth1} B");
    assert!(eth1 > eth0 / 4.0, "eth0 sent {eth0} B, eth1 {eth1} B");
    // RDMA (the software provider: a device on each interface) takes the
    // same per-channel choice of port
    let (eth0, eth1, err) = job("CCL_SOCKET_IFNAME=eth0,eth1", &["-x", "CCL_IB_SOFT=1", "-x", "CCL_DEBUG=INFO"]);
    eprintln!("both interfaces, soft rdma: eth0 sent {eth0} B, eth1 {eth1} B");
    assert!(eth1 > eth0 / 4.0, "soft rdma: eth0 sent {eth0} B, eth1 {eth1} B");
    // rank 0 (host 1) sends to rank 2 (host 2) on each channel through
    // another device: one on eth0's network, one on eth1's
    let devs: std::collections::HashSet<&str> = err
        .lines()
        .filter(|l| l.contains("ccl INFO rank 0 send rank 2: rdma soft:"))
        .filter_map(|l| l.rsplit("soft:").next())
        .collect();
    assert_eq!(devs.len(), 2, "{err}");
    // host 2's eth1 down: it is left out there, said at INFO, and every
    // connection to or from host 2 takes eth0
    c.nic(2, 1, false);
    let (_, _, err) = job("CCL_SOCKET_IFNAME=eth0,eth1", &["-x", "CCL_DEBUG=INFO"]);
    c.nic(2, 1, true);
    assert!(err.contains("CCL_SOCKET_IFNAME: eth1 (") && err.contains(") is down: left out"), "{err}");
    // an interface no host has: an error naming the variable, on every rank
    let o = run(&c, &["-np", "4", "-x", "CCL_SOCKET_IFNAME=eth0,nosuch9", MATRIX]);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("CCL_SOCKET_IFNAME") && err.contains("no interface nosuch9 with an IPv4 address"), "{err}");
    assert_clean(&c);
}
