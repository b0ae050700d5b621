//! Running a job: rendezvous, ranks, output, supervision, cleanup.
//!
//! When a rank fails (non-zero exit or a signal), the others get a moment
//! to notice the lost peer and exit with their own error, then SIGTERM,
//! then SIGKILL. cclrun exits with the first failing rank's code (128 +
//! signal for a signal). SIGINT and SIGTERM sent to cclrun are passed to
//! every rank. Ranks die with cclrun: they are started with
//! PR_SET_PDEATHSIG = SIGKILL.

use ccl::bootstrap::Rendezvous;
use ccl::transport::shm::Shm;
use cclrun::place::Placement;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// What to run, where.
pub struct Spec {
    /// Per rank: host and local rank.
    pub placement: Vec<Placement>,
    /// Host names by index.
    pub host_names: Vec<String>,
    /// The resolved program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (`-x`).
    pub env: Vec<(String, String)>,
    /// Prefix output lines with `[rank]`.
    pub tag_output: bool,
    /// End the job after this long.
    pub timeout: Option<Duration>,
}

/// Time the surviving ranks get to report a lost peer themselves.
const NOTICE: Duration = Duration::from_secs(2);
/// Time between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(3);

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "signal",
    }
}

fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signal_name(s)),
        _ => "ended".into(),
    }
}

fn exit_code(st: ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Copies `r` to our stdout or stderr a line at a time, prefixed if asked.
fn forward(r: impl Read + Send + 'static, prefix: Option<String>, to_err: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let mut out: Box<dyn Write> =
                        if to_err { Box::new(std::io::stderr().lock()) } else { Box::new(std::io::stdout().lock()) };
                    if let Some(p) = &prefix {
                        let _ = out.write_all(p.as_bytes());
                    }
                    let _ = out.write_all(&line);
                    let _ = out.flush();
                }
            }
        }
    })
}

fn kill(children: &[Child], status: &[Option<ExitStatus>], sig: i32) {
    for (c, s) in children.iter().zip(status) {
        if s.is_none() {
            // SAFETY: sending a signal to our own child, which we have not
            // reaped; SIGCONT after SIGTERM lets a stopped rank act on it.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
                if sig == libc::SIGTERM {
                    libc::kill(c.id() as libc::pid_t, libc::SIGCONT);
                }
            }
        }
    }
}

/// Runs the job; the exit code for cclrun.
pub fn run(spec: &Spec) -> i32 {
    let np = spec.placement.len();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let rv = match Rendezvous::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), np) {
        Ok(rv) => rv,
        Err(e) => {
            eprintln!("cclrun: {e}");
            return 1;
        }
    };
    let id = rv.id().clone();
    Shm::sweep_stale();
    let serve_for = spec.timeout.unwrap_or(Duration::from_secs(600));
    let server = std::thread::spawn(move || rv.serve(serve_for));
    let parent = std::process::id() as libc::pid_t;
    let mut children = Vec::with_capacity(np);
    let mut pumps = Vec::new();
    for (rank, p) in spec.placement.iter().enumerate() {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("CCL_RANK", rank.to_string())
            .env("CCL_WORLD_SIZE", np.to_string())
            .env("CCL_LOCAL_RANK", p.local_rank.to_string())
            .env("CCL_LOCAL_SIZE", p.local_size.to_string())
            .env("CCL_UNIQUE_ID", id.to_env_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: between fork and exec we only make async-signal-safe calls
        // (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(1); // cclrun died before prctl took effect
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(mut c) => {
                let prefix = spec.tag_output.then(|| format!("[{rank}] "));
                if let Some(o) = c.stdout.take() {
                    pumps.push(forward(o, prefix.clone(), false));
                }
                if let Some(e) = c.stderr.take() {
                    pumps.push(forward(e, prefix, true));
                }
                children.push(c);
            }
            Err(e) => {
                eprintln!("cclrun: cannot start rank {rank} ({}): {e}", spec.program.display());
                let none = vec![None; children.len()];
                kill(&children, &none, libc::SIGKILL);
                for c in &mut children {
                    let _ = c.wait();
                }
                return 127;
            }
        }
    }

    let start = Instant::now();
    let mut status: Vec<Option<ExitStatus>> = vec![None; np];
    let mut first_fail: Option<(usize, ExitStatus, Instant)> = None;
    let mut term_at: Option<Instant> = None;
    let mut forwarded: Option<i32> = None;
    let mut timed_out = false;
    loop {
        // ranks that ended since the last sweep; when several failed at once,
        // one killed by a signal is the cause rather than one that reported it
        let mut ended = Vec::new();
        for (rank, c) in children.iter_mut().enumerate() {
            if status[rank].is_none() {
                if let Ok(Some(st)) = c.try_wait() {
                    status[rank] = Some(st);
                    ended.push((rank, st));
                }
            }
        }
        ended.sort_by_key(|(rank, st)| (st.signal().is_none(), *rank));
        if let Some(&(rank, st)) = ended.iter().find(|(_, st)| !st.success()) {
            if first_fail.is_none() && forwarded.is_none() && !timed_out {
                let host = &spec.host_names[spec.placement[rank].host];
                eprintln!(
                    "cclrun: rank {rank} (pid {}) on {host} {}; ending the job",
                    children[rank].id(),
                    describe(st)
                );
                first_fail = Some((rank, st, Instant::now()));
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!("cclrun: got {}, passing it to every rank", signal_name(sig));
            kill(&children, &status, sig);
            forwarded = Some(sig);
            term_at.get_or_insert_with(Instant::now);
        }
        if let Some(limit) = spec.timeout {
            if !timed_out && start.elapsed() >= limit {
                eprintln!("cclrun: job timed out after {:.1} s; ending it", limit.as_secs_f64());
                timed_out = true;
                kill(&children, &status, libc::SIGTERM);
                term_at.get_or_insert_with(Instant::now);
            }
        }
        if let Some((_, _, at)) = first_fail {
            if term_at.is_none() && at.elapsed() >= NOTICE {
                kill(&children, &status, libc::SIGTERM);
                term_at = Some(Instant::now());
            }
        }
        if term_at.is_some_and(|t| t.elapsed() >= KILL_GRACE) {
            kill(&children, &status, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in pumps {
        let _ = p.join();
    }
    // files of ranks that died before removing them
    let prefix = Shm::file_prefix(&id.job_tag());
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    // a rendezvous that failed while no rank did (a rank never joined)
    if server.is_finished() && first_fail.is_none() && forwarded.is_none() && !timed_out {
        if let Ok(Err(e)) = server.join() {
            eprintln!("cclrun: {e}");
        }
    }
    match (timed_out, first_fail, forwarded) {
        (true, _, _) => 124,
        (_, Some((_, st, _)), _) => exit_code(st),
        (_, None, Some(sig)) => 128 + sig,
        _ => status.iter().flatten().map(|s| exit_code(*s)).find(|&c| c != 0).unwrap_or(0),
    }
}
