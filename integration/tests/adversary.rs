//! The adversary suite: a local user without privileges (`nobody`,
//! through setpriv) attacks jobs of this user, and an ordinary machine (a
//! small /dev/shm, a tiny CCL_CHUNKSIZE, ranks that disagree on a root)
//! squeezes them. Every row: the job is unharmed, or fails with a clear
//! error on every rank that reports, within its bound; nothing is
//! overwritten; nothing is left behind. Prints the table
//! (`cargo test -p ccl-integration --test adversary -- --nocapture`).
//! Needs root (setpriv, mount namespaces): skipped elsewhere unless
//! CCL_TEST_REQUIRE_ALL=1.

use ccl_integration::cclrun;
use ccl_integration::cluster::unavailable;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const FAULT: &str = env!("CARGO_BIN_EXE_fault");
const ADVERSARY: &str = env!("CARGO_BIN_EXE_adversary");

/// What a row expects of its job.
enum Want {
    /// Exit 0 and this many lines of `checked`.
    Unharmed(usize),
    /// Exit 0, or a failure whose every rank error contains one of these
    /// and whose output contains the first.
    UnharmedOr(usize, &'static [&'static str]),
    /// A failure (no signal) whose every rank error contains one of
    /// these, the first among them.
    Fails(&'static [&'static str]),
}

struct Row {
    name: String,
    ranks: usize,
    exit: Option<i32>,
    ok: bool,
    took: Duration,
}

/// This user's files in /dev/shm whose names start `ccl-`.
fn own_shm_files() -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ccl-"))
        .filter(|e| e.path().symlink_metadata().is_ok_and(|m| m.uid() == me))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Whether `o` meets `want`; the reason where it does not.
fn judge(o: &Output, want: &Want) -> Result<(), String> {
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let errors: Vec<&str> = err.lines().filter(|l| l.contains(" error: ")).collect();
    let checked = out.matches("checked").count();
    let fails_clearly = |clear: &[&str]| {
        o.status.code().is_some_and(|c| c != 0)
            && !err.contains("signal")
            && err.contains(clear[0])
            && !errors.is_empty()
            && errors.iter().all(|l| clear.iter().any(|c| l.contains(c)))
    };
    let ok = match want {
        Want::Unharmed(n) => o.status.success() && checked == *n,
        Want::UnharmedOr(n, clear) => o.status.success() && checked == *n || fails_clearly(clear),
        Want::Fails(clear) => fails_clearly(clear),
    };
    if ok && !err.contains("forged") {
        Ok(())
    } else {
        Err(format!("exit {:?}\nstdout:\n{out}\nstderr:\n{err}", o.status.code()))
    }
}

struct Suite {
    rows: Vec<Row>,
    failures: Vec<String>,
    dir: PathBuf,
}

impl Suite {
    /// Runs `cclrun -np ranks args`, through `wrap` (a command line the
    /// cclrun command is appended to), and judges it.
    fn job(&mut self, name: &str, ranks: usize, wrap: &[&str], args: &[&str], want: Want, bound: u64) {
        let np = ranks.to_string();
        let t = Instant::now();
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(cclrun());
                c
            }
            None => Command::new(cclrun()),
        };
        let o = cmd.args(["-np", &np, "--oversubscribe", "-x", "CCL_TIMEOUT=60"]).args(args).output().expect("cclrun");
        let took = t.elapsed();
        let verdict = judge(&o, &want).and_then(|()| match took < Duration::from_secs(bound) {
            true => Ok(()),
            false => Err(format!("took {took:?}, over its bound of {bound} s")),
        });
        if let Err(why) = &verdict {
            self.failures.push(format!("{name} ({ranks} ranks): {why}"));
        }
        self.rows.push(Row { name: name.into(), ranks, exit: o.status.code(), ok: verdict.is_ok(), took });
    }

    /// Starts `ranks` ranks of `cmd` as another launcher would (Slurm's
    /// variables), with the rendezvous at 127.0.0.1:`port` (`CCL_ROOT`),
    /// and judges them as one job that must be unharmed.
    fn ranks_at(&mut self, name: &str, ranks: usize, port: u16, env: &[(&str, &str)], cmd: &[&str], bound: u64) {
        use std::os::unix::process::ExitStatusExt;
        let secret: String = (0..16).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        let t = Instant::now();
        let started: Vec<_> = (0..ranks)
            .map(|r| {
                Command::new(cmd[0])
                    .args(&cmd[1..])
                    .envs([("SLURM_PROCID", r.to_string()), ("SLURM_NTASKS", ranks.to_string())])
                    .envs([("SLURM_LOCALID", r.to_string()), ("CCL_ROOT", format!("127.0.0.1:{port}"))])
                    .envs([("CCL_SECRET", secret.clone()), ("CCL_TIMEOUT", "60".into())])
                    .envs(env.iter().copied())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("a rank")
            })
            .collect();
        let mut all = Output { status: std::process::ExitStatus::from_raw(0), stdout: Vec::new(), stderr: Vec::new() };
        for rank in started {
            let o = rank.wait_with_output().expect("rank");
            if all.status.success() {
                all.status = o.status;
            }
            all.stdout.extend(o.stdout);
            all.stderr.extend(o.stderr);
        }
        let took = t.elapsed();
        let verdict = judge(&all, &Want::Unharmed(ranks)).and_then(|()| match took < Duration::from_secs(bound) {
            true => Ok(()),
            false => Err(format!("took {took:?}, over its bound of {bound} s")),
        });
        if let Err(why) = &verdict {
            self.failures.push(format!("{name} ({ranks} ranks): {why}"));
        }
        self.rows.push(Row { name: name.into(), ranks, exit: all.status.code(), ok: verdict.is_ok(), took });
    }

    /// Starts the adversary, as `nobody`, with `args`.
    fn attacker(&self, args: &[&str]) -> std::process::Child {
        let exe = self.dir.join("adversary");
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the adversary")
    }
}

/// The adversary's binary, copied where `nobody` may run it.
fn prepare(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let exe = dir.join("adversary");
    std::fs::copy(ADVERSARY, &exe).expect("copy the adversary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn adversary_suite() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = Path::new("/usr/bin/setpriv").exists() && Path::new("/usr/bin/unshare").exists();
    if unavailable("root, setpriv and unshare (for the adversary suite)", !(root && tools)) {
        return;
    }
    let before = own_shm_files();
    let dir = std::env::temp_dir().join(format!("ccl-adversary-{}", std::process::id()));
    prepare(&dir);
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").expect("victim");
    let mut s = Suite { rows: Vec::new(), failures: Vec::new(), dir: dir.clone() };
    let check = ["-x", "CCL_SHM_DISABLE=0", FAULT, "check", "100000"];

    // links, forged notes and pre-made FIFOs where the names of jobs seen lead
    let mut squat = s.attacker(&["squat", "12", victim.to_str().unwrap_or("")]);
    std::thread::sleep(Duration::from_millis(300));
    for ranks in [2, 4, 4] {
        s.job("links, notes, FIFOs planted by nobody", ranks, &[], &check, Want::Unharmed(ranks), 30);
    }
    let _ = squat.wait();
    let planted = std::io::read_to_string(squat.stdout.take().expect("stdout")).unwrap_or_default();
    println!("adversary: {}", planted.trim());
    if std::fs::read(&victim).ok().as_deref() != Some(b"precious".as_slice()) {
        s.failures.push("the file the links pointed at was overwritten".into());
    }

    // idle connections to the rendezvous and to every rank's listener
    let mut flood = s.attacker(&["flood", "12", "150"]);
    std::thread::sleep(Duration::from_millis(300));
    let tcp = ["-x", "CCL_SHM_DISABLE=1", FAULT, "check", "100000", "split"];
    for ranks in [2, 4] {
        s.job("rendezvous and listeners flooded (tcp)", ranks, &[], &tcp, Want::Unharmed(ranks), 40);
    }
    // the software RDMA devices listen too
    let soft = ["-x", "CCL_SHM_DISABLE=1", "-x", "CCL_IB_SOFT=1", FAULT, "check", "100000", "split"];
    s.job("listeners flooded (soft rdma)", 4, &[], &soft, Want::Unharmed(4), 40);
    // a second interface (a dummy one, whose loopback address the attackers
    // reach): every rank listens on both, the second channel's connections
    // go to the second, and both are flooded
    if let Some(dev) = Dummy::add() {
        let x = format!("CCL_SOCKET_IFNAME=lo,{}", dev.0);
        let two = ["-x", "CCL_SHM_DISABLE=1", "-x", &x, "-x", "CCL_NCHANNELS=2", FAULT, "check", "100000", "split"];
        s.job("listeners on two interfaces flooded (tcp)", 4, &[], &two, Want::Unharmed(4), 40);
    }
    let _ = flood.wait();
    let held = std::io::read_to_string(flood.stdout.take().expect("stdout")).unwrap_or_default();
    println!("adversary: {}", held.trim());

    // two processes opening and closing connections as fast as they can
    // at the rendezvous and every rank's listener, holding the last ones
    let churn: Vec<_> = (0..2).map(|_| s.attacker(&["churn", "40"])).collect();
    std::thread::sleep(Duration::from_millis(300));
    for (ranks, x) in [(2, "CCL_SHM_DISABLE=1"), (4, "CCL_SHM_DISABLE=1"), (4, "CCL_SHM_DISABLE=0")] {
        let name = format!("connections churned by 2 ({})", if x.ends_with('1') { "tcp" } else { "shm" });
        s.job(&name, ranks, &[], &["-x", x, FAULT, "check", "100000", "split"], Want::Unharmed(ranks), 60);
    }
    s.job("connections churned by 2 (soft rdma)", 4, &[], &soft, Want::Unharmed(4), 60);
    for mut a in churn {
        drop(a.stdin.take()); // the end of its input ends it
        let _ = a.wait();
        let said = std::io::read_to_string(a.stdout.take().expect("stdout")).unwrap_or_default();
        println!("adversary: {}", said.trim());
    }

    // the same at a rendezvous whose port is known before the job starts
    // (CCL_ROOT, ranks started by another launcher): the churn is at full
    // speed when rank 0 starts listening
    for (ranks, shm) in [(4, "1"), (4, "0"), (8, "1")] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(0, |a| a.port());
        let churn: Vec<_> = (0..2).map(|_| s.attacker(&["churn", "60", &port.to_string()])).collect();
        std::thread::sleep(Duration::from_millis(500));
        let name = format!("CCL_ROOT's port churned by 2 ({})", if shm == "1" { "tcp" } else { "shm" });
        s.ranks_at(&name, ranks, port, &[("CCL_SHM_DISABLE", shm)], &[FAULT, "check", "100000", "split"], 60);
        for mut a in churn {
            drop(a.stdin.take()); // the end of its input ends it
            let _ = a.wait();
            let said = std::io::read_to_string(a.stdout.take().expect("stdout")).unwrap_or_default();
            println!("adversary: {}", said.trim());
        }
    }

    // /dev/shm full of junk names by another user: every rank (and
    // cclrun) used to look each up before starting
    let mut junk = s.attacker(&["junk", "120", "100000"]);
    let mut said = String::new();
    let mut out = std::io::BufReader::new(junk.stdout.take().expect("stdout"));
    let _ = std::io::BufRead::read_line(&mut out, &mut said);
    println!("adversary: {}", said.trim());
    for ranks in [2, 8] {
        s.job("100 k junk ccl-* names in /dev/shm", ranks, &[], &check, Want::Unharmed(ranks), 30);
    }
    drop(junk.stdin.take());
    let _ = junk.wait();

    // a small /dev/shm: Docker's 64 MiB, and 1 MiB
    let full: &[&str] = &["/dev/shm has", "lost rank", "transport:"];
    for size in ["64m", "1m"] {
        for ranks in [2, 8, 16] {
            let mount = format!("mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$0\" \"$@\"");
            let wrap = ["unshare", "-m", "sh", "-c", &mount];
            let name = format!("/dev/shm of {} MiB", if size == "64m" { 64 } else { 1 });
            s.job(
                &name,
                ranks,
                &wrap,
                &["-x", "CCL_SHM_DISABLE=0", FAULT, "check", "1000000"],
                Want::UnharmedOr(ranks, full),
                60,
            );
        }
    }

    // ranks that disagree on the root, by default and under CCL_CHECK=full,
    // in a call followed by another or in the last: the job fails
    let roots: &[&str] =
        &["but the peer called", "lost rank", "communicator is unusable", "found as the communicator was dropped"];
    for check in ["default", "full"] {
        for (coll, count) in [("broadcast", "4"), ("broadcast", "4194304"), ("reduce", "4"), ("reduce", "4194304")] {
            for (ranks, last) in [(2, ""), (4, ""), (4, "last")] {
                let name = format!(
                    "{coll} of {count} with roots mismatched ({check}{})",
                    if last.is_empty() { "" } else { ", last" }
                );
                let x = format!("CCL_CHECK={check}");
                let mut args = vec!["-x", &x, FAULT, "roots", coll, count];
                args.extend((!last.is_empty()).then_some(last));
                s.job(&name, ranks, &[], &args, Want::Fails(roots), 40);
            }
        }
    }

    // a tiny chunk size
    for x in ["CCL_SHM_DISABLE=0", "CCL_SHM_DISABLE=1"] {
        let name = format!("CCL_CHUNKSIZE=1 on 256 K floats ({})", if x.ends_with('0') { "shm" } else { "tcp" });
        s.job(&name, 2, &[], &["-x", x, "-x", "CCL_CHUNKSIZE=1", FAULT, "check", "262144"], Want::Unharmed(2), 60);
    }

    ctrl_c_inside_alloc_shared(&mut s);

    println!("| {:<58} | ranks | exit | outcome      | time     |", "scenario");
    println!("|{}|-------|------|--------------|----------|", "-".repeat(60));
    for r in &s.rows {
        let exit = r.exit.map_or("sig".into(), |c| c.to_string());
        let outcome = if r.ok { "as required" } else { "WRONG" };
        println!("| {:<58} | {:>5} | {exit:>4} | {outcome:<12} | {:>6.2} s |", r.name, r.ranks, r.took.as_secs_f64());
    }
    let left: Vec<String> = own_shm_files().into_iter().filter(|f| !before.contains(f)).collect();
    println!("files left in /dev/shm: {}", left.len());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(s.failures.is_empty(), "{}", s.failures.join("\n---\n"));
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// A network interface besides `lo` (one end of a veth pair, both up)
/// with a loopback address of its own, for as long as it lives; `None`
/// (said, or a failure where everything is required) where it cannot be
/// made.
struct Dummy(String);

impl Dummy {
    fn add() -> Option<Dummy> {
        let name = format!("ccladv{}", std::process::id() % 100_000);
        let peer = format!("{name}p");
        let ip = |args: &[&str]| Command::new("ip").args(args).status().is_ok_and(|s| s.success());
        let made = ip(&["link", "add", &name, "type", "veth", "peer", "name", &peer]);
        let dev = made.then(|| Dummy(name.clone()));
        let up = made
            && ip(&["addr", "add", "127.0.3.1/32", "dev", &name])
            && ip(&["link", "set", &peer, "up"])
            && ip(&["link", "set", &name, "up"]);
        // (running once its link has a carrier: ccl leaves it out until then)
        let carrier = format!("/sys/class/net/{name}/carrier");
        let end = Instant::now() + Duration::from_secs(5);
        while up && std::fs::read_to_string(&carrier).map_or(true, |c| c.trim() != "1") && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        if unavailable("a second interface (ip link add ... type veth)", !up) {
            return None;
        }
        dev
    }
}

impl Drop for Dummy {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

/// Ctrl-C while a rank waits inside `alloc_shared` of 64 MiB: its file
/// goes with the job.
fn ctrl_c_inside_alloc_shared(s: &mut Suite) {
    let before = own_shm_files();
    let t = Instant::now();
    let mut job = Command::new(cclrun())
        .args(["-np", "2", FAULT, "alloc-hang", "16777216"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cclrun");
    let made = || own_shm_files().into_iter().any(|f| !before.contains(&f) && f.contains("-a0-"));
    while !made() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let seen = made();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(job.id() as i32, libc::SIGINT) };
    let code = job.wait().expect("wait").code();
    let left: Vec<String> = own_shm_files().into_iter().filter(|f| !before.contains(f)).collect();
    let ok = seen && code == Some(130) && left.is_empty();
    if !ok {
        s.failures.push(format!("Ctrl-C inside alloc_shared: file seen {seen}, exit {code:?}, left {left:?}"));
    }
    let name = "Ctrl-C inside alloc_shared of 64 MiB".to_string();
    s.rows.push(Row { name, ranks: 2, exit: code, ok, took: t.elapsed() });
}
