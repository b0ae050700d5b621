//! Starting one host's ranks and watching them: used by cclrun for the
//! ranks of its own host and by `cclrun agent` on every other host.
//!
//! Each rank's stdout and stderr are read a line at a time and its exit is
//! reported, all as [`Event`]s on one channel. Ranks die with the thread
//! that started them (`PR_SET_PDEATHSIG = SIGKILL`), so [`spawn`] must be
//! called from a thread that lives as long as the job (the main thread).

use crate::proto::{Bind, Event, HostJob, Status};
use ccl::launch::JobFiles;
use ccl::launch::{cpu_of, evenly_oversubscribed};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a rank's exit waits for the rest of its output.
const DRAIN: Duration = Duration::from_secs(1);

/// Finds `prog` like a shell would (relative to the working directory when
/// it has a `/`, else on `PATH`); the message says why not.
pub fn resolve(prog: &str) -> Result<PathBuf, String> {
    let executable =
        |p: &Path| p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        if !p.exists() {
            return Err(format!("{prog}: no such file"));
        }
        return if executable(&p) { Ok(p) } else { Err(format!("{prog}: not an executable file")) };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| executable(p))
        .ok_or_else(|| format!("{prog}: command not found"))
}

/// The running ranks of one host.
pub struct Ranks {
    /// Per started rank: its pid while it has not been reaped.
    live: Arc<Mutex<Vec<Option<libc::pid_t>>>>,
}

impl Ranks {
    /// Sends `sig` to every rank still running, and to the processes it
    /// started (its process group); after SIGTERM also SIGCONT, so a
    /// stopped rank acts on it.
    pub fn signal(&self, sig: i32) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        for pid in live.iter().flatten() {
            // SAFETY: the pid is our unreaped child (the waiter clears it
            // under this lock before reaping), so it cannot have been reused.
            unsafe {
                for s in [sig, libc::SIGCONT].into_iter().take(if sig == libc::SIGTERM { 2 } else { 1 }) {
                    // the group, or the rank alone if it has not made its group yet
                    if libc::kill(-*pid, s) != 0 {
                        libc::kill(*pid, s);
                    }
                }
            }
        }
    }

    /// Ranks not yet reaped.
    pub fn running(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).iter().flatten().count()
    }
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads bit `c` of a live set; c < CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// A CPU set holding only `cpu`.
fn cpu_set(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain bits; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` came from the allowed set, so it is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// Status of an exited child.
fn status_of(st: std::process::ExitStatus) -> Status {
    Status { code: st.code(), signal: st.signal() }
}

/// Starts every rank of `job` with `program` (already resolved); events go
/// to `tx`. On a failure to start, or when `stop()` says so before a rank
/// (a signal to the launcher), the ranks already started are killed.
pub fn spawn(job: &HostJob, program: &Path, tx: &Sender<Event>, stop: &dyn Fn() -> bool) -> Result<Ranks, String> {
    let live = Arc::new(Mutex::new(Vec::with_capacity(job.ranks.len())));
    let ranks = Ranks { live: live.clone() };
    let parent = std::process::id() as libc::pid_t;
    let allowed = allowed_cpus();
    let pinned = match job.bind {
        Bind::Core => true,
        Bind::Auto => evenly_oversubscribed(job.ranks.len(), allowed.len()),
        Bind::None => false,
    };
    let cpus: &[usize] = if pinned { &allowed } else { &[] };
    for r in &job.ranks {
        if stop() {
            // interrupted while starting many ranks: end the ones started
            ranks.signal(libc::SIGKILL);
            return Err(format!("interrupted after starting {} of {} ranks", r.local_rank, job.ranks.len()));
        }
        let mut cmd = Command::new(program);
        cmd.args(&job.args)
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .env("CCL_RANK", r.rank.to_string())
            .env("CCL_WORLD_SIZE", job.world.to_string())
            .env("CCL_LOCAL_RANK", r.local_rank.to_string())
            .env("CCL_LOCAL_SIZE", r.local_size.to_string())
            // the host's CPUs, which a pinned rank cannot see for itself
            .env("CCL_HOST_CPUS", allowed.len().max(1).to_string())
            // where the ranks look for ranks this launcher gives up on (note_lost)
            .env("CCL_LAUNCHER_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &job.cwd {
            cmd.current_dir(dir);
        }
        let pin = (!cpus.is_empty()).then(|| cpu_set(cpus[cpu_of(r.local_rank, r.local_size, cpus.len())]));
        // SAFETY: between fork and exec we only make async-signal-safe calls
        // (setpgid, prctl, getppid, sched_setaffinity, _exit) on memory
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(set) = &pin {
                    // a CPU that cannot be pinned to leaves the rank unpinned
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
                }
                libc::setpgid(0, 0); // its own group, so its children can be signalled with it
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(1); // the launcher died before prctl took effect
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => {
                let pid = child.id() as libc::pid_t;
                let slot = {
                    let mut l = live.lock().unwrap_or_else(|p| p.into_inner());
                    l.push(Some(pid));
                    l.len() - 1
                };
                let _ = tx.send(Event::Started { rank: r.rank, pid: pid as u32 });
                watch(child, r.rank, slot, live.clone(), tx.clone());
            }
            Err(e) => {
                ranks.signal(libc::SIGKILL);
                return Err(format!("cannot start rank {} ({}): {e}", r.rank, program.display()));
            }
        }
    }
    Ok(ranks)
}

/// Pumps the child's output and reports its exit.
fn watch(mut child: Child, rank: usize, slot: usize, live: Arc<Mutex<Vec<Option<libc::pid_t>>>>, tx: Sender<Event>) {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = 0;
    if let Some(o) = child.stdout.take() {
        pump(o, rank, false, tx.clone(), done_tx.clone());
        pumps += 1;
    }
    if let Some(e) = child.stderr.take() {
        pump(e, rank, true, tx.clone(), done_tx);
        pumps += 1;
    }
    std::thread::spawn(move || {
        let pid = child.id();
        // wait without reaping, so the pid stays ours while we mark it dead
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: waitid on our own child with a valid siginfo_t pointer.
            let rc = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let status = {
            let mut l = live.lock().unwrap_or_else(|p| p.into_inner());
            l[slot] = None;
            child.wait().map(status_of).unwrap_or(Status { code: None, signal: None })
        };
        for _ in 0..pumps {
            if done_rx.recv_timeout(DRAIN).is_err() {
                break; // something else holds the pipe open; report the exit anyway
            }
        }
        let _ = tx.send(Event::Exit { rank, status });
    });
}

/// The longest line relayed whole: a longer one goes out in pieces of this
/// size, each ended by [`CUT`], so that a rank printing without newlines
/// cannot make cclrun hold its output.
pub const MAX_LINE: usize = 1 << 20;

/// What ends a piece of a line longer than [`MAX_LINE`].
pub const CUT: &[u8] = b" [cclrun: line cut at 1 MiB, continued on the next]\n";

/// Sends `r`'s lines as output events; newline-terminated, bytes as they
/// came, lines over [`MAX_LINE`] cut into pieces.
fn pump(r: impl Read + Send + 'static, rank: usize, err: bool, tx: Sender<Event>, done: Sender<()>) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        while let Some(line) = next_line(&mut r) {
            if tx.send(Event::Output { rank, err, line }).is_err() {
                break;
            }
        }
        let _ = done.send(());
    });
}

/// The next line of `r`, newline-terminated, or its next [`MAX_LINE`]
/// bytes ended by [`CUT`]; `None` at the end.
fn next_line(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    match r.by_ref().take(MAX_LINE as u64).read_until(b'\n', &mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) if line.ends_with(b"\n") => Some(line),
        Ok(n) => {
            line.extend_from_slice(if n == MAX_LINE { CUT } else { b"\n" });
            Some(line)
        }
    }
}

/// Tells this host's ranks of the job of `files` that `ranks` of `host`
/// are lost and why (see [`ccl::launch::lost_notes`]), so that ranks
/// waiting on them fail now instead of when their own links time out.
pub fn note_lost(files: &JobFiles, ranks: &[usize], host: &str, why: &str) {
    let at = ccl::launch::lost_notes::path(files, std::process::id());
    if let Err(e) = ccl::launch::lost_notes::add(&at, ranks, host, why) {
        eprintln!("cclrun: cannot note lost ranks in {}: {e}", at.display());
    }
}

/// Removes the job's shared-memory files left by ranks that died before
/// removing them (and the lost notes, and `alloc_shared`'s buffers).
pub fn remove_shm_files(files: &JobFiles) {
    let prefix = files.prefix();
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_go_out_in_marked_pieces_and_short_ones_whole() {
        let mut text = vec![b'x'; 2 * MAX_LINE + 5];
        text.extend_from_slice(b"\nshort\nlast");
        let mut r = std::io::Cursor::new(text);
        let lines: Vec<Vec<u8>> = std::iter::from_fn(|| next_line(&mut r)).collect();
        assert_eq!(lines.len(), 5);
        for piece in &lines[..2] {
            assert_eq!(piece.len(), MAX_LINE + CUT.len());
            assert!(piece.ends_with(CUT));
        }
        assert_eq!(lines[2], b"xxxxx\n");
        assert_eq!(lines[3], b"short\n");
        assert_eq!(lines[4], b"last\n");
    }
}
