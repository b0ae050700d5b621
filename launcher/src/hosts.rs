//! Getting every host ready before any rank starts: SSH sessions to the
//! other hosts (in parallel), then an agent on each that has checked the
//! program is there. Every host that fails is reported by name.

use crate::spec::Spec;
use ccl::launch::UniqueId;
use cclrun::proto::{HostJob, RankSpec};
use cclrun::ssh::{self, Agent, Conn};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Exit code when a host cannot be reached or refuses us (as ssh's).
const UNREACHABLE: i32 = 255;
/// Exit code when the program or the agent is missing somewhere.
const NOT_FOUND: i32 = 127;

/// Variables of cclrun's own environment that are per process or per host,
/// so never forwarded to other hosts.
const NOT_FORWARDED: [&str; 6] =
    ["CCL_HOSTID", "CCL_RANK", "CCL_WORLD_SIZE", "CCL_LOCAL_RANK", "CCL_LOCAL_SIZE", "CCL_UNIQUE_ID"];

/// Shows "what: done/total" on a terminal, for jobs large enough to wait on.
struct Progress {
    what: &'static str,
    total: usize,
    done: AtomicUsize,
    show: bool,
}

impl Progress {
    fn new(what: &'static str, total: usize, show: bool) -> Self {
        Progress { what, total, done: AtomicUsize::new(0), show }
    }

    fn tick(&self) {
        let d = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if self.show {
            let end = if d == self.total { "\n" } else { "" };
            let _ = write!(std::io::stderr().lock(), "\rcclrun: {} {d}/{}{end}", self.what, self.total);
        }
    }
}

/// Whether to show launch progress: stderr is a terminal and the job is
/// large enough to wait on (4 or more other hosts, or 64 or more ranks).
pub fn on_terminal(spec: &Spec) -> bool {
    // SAFETY: isatty has no preconditions.
    let tty = unsafe { libc::isatty(2) } == 1;
    tty && ((0..spec.host_names.len()).filter(|&h| is_remote(spec, h)).count() >= 4 || spec.placement.len() >= 64)
}

/// Host `h` is another host with ranks to run.
fn is_remote(spec: &Spec, h: usize) -> bool {
    !spec.local[h] && spec.placement.iter().any(|p| p.host == h)
}

/// Runs `f` for every remote host at once; results by host index (`None`
/// for this host).
fn each_remote<T: Send>(spec: &Spec, f: impl Fn(usize) -> Result<T, String> + Sync) -> Vec<Option<Result<T, String>>> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..spec.host_names.len()).map(|h| is_remote(spec, h).then(|| s.spawn(move || f(h)))).collect();
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<T, String>>| {
            h.join().unwrap_or_else(|_| Err("internal error: the thread for this host panicked".into()))
        };
        handles.into_iter().map(|h| h.map(joined)).collect()
    })
}

/// Reports every failed host by name; the exit code if any failed.
fn report<T>(spec: &Spec, results: Vec<Option<Result<T, String>>>, code: i32) -> Result<Vec<Option<T>>, i32> {
    let mut failed = false;
    let mut out = Vec::with_capacity(results.len());
    for (h, r) in results.into_iter().enumerate() {
        match r {
            Some(Err(why)) => {
                eprintln!("cclrun: host {}: {why}", spec.host_names[h]);
                failed = true;
                out.push(None);
            }
            Some(Ok(v)) => out.push(Some(v)),
            None => out.push(None),
        }
    }
    if failed {
        eprintln!("cclrun: no rank was started");
        return Err(code);
    }
    Ok(out)
}

/// Connects to and logs in on every remote host.
pub fn connect_all(spec: &Spec) -> Result<Vec<Option<Conn>>, i32> {
    let nremote = (0..spec.host_names.len()).filter(|&h| is_remote(spec, h)).count();
    let progress = Progress::new("hosts connected", nremote, on_terminal(spec));
    let results = each_remote(spec, |h| {
        let r = ssh::connect(&spec.host_names[h], &spec.ssh);
        progress.tick();
        r
    });
    report(spec, results, UNREACHABLE)
}

/// What host `h` runs: its ranks, with the job's environment; `remote`
/// adds cclrun's own `CCL_*` settings, which local ranks inherit anyway.
pub fn host_job(spec: &Spec, h: usize, id: &UniqueId, remote: bool) -> HostJob {
    let mut env = Vec::new();
    if remote {
        env.extend(std::env::vars().filter(|(k, _)| k.starts_with("CCL_") && !NOT_FORWARDED.contains(&k.as_str())));
    }
    env.extend(spec.env.iter().cloned());
    env.push(("CCL_UNIQUE_ID".into(), id.to_env_string()));
    HostJob {
        host: spec.host_names[h].clone(),
        program: spec.program.clone(),
        args: spec.args.clone(),
        cwd: std::env::current_dir().ok().map(|d| d.to_string_lossy().into_owned()),
        env,
        ranks: spec
            .placement
            .iter()
            .enumerate()
            .filter(|(_, p)| p.host == h)
            .map(|(rank, p)| RankSpec { rank, local_rank: p.local_rank, local_size: p.local_size })
            .collect(),
        world: spec.placement.len(),
        bind: spec.bind,
    }
}

/// Every host ready to start its ranks.
pub struct Started {
    /// Per host: its agent (`None` for this host).
    pub agents: Vec<Option<Agent>>,
    /// The program, found here, when this host runs ranks.
    pub local_program: Option<PathBuf>,
}

/// Finds the program here (if this host runs ranks) and starts the agents
/// elsewhere, which look for it there.
pub fn prepare(spec: &Spec, conns: Vec<Option<Conn>>, id: &UniqueId) -> Result<Started, i32> {
    let local_program = if spec.local.iter().enumerate().any(|(h, &l)| l && spec.placement.iter().any(|p| p.host == h))
    {
        match cclrun::spawn::resolve(&spec.program) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("cclrun: {e}");
                return Err(NOT_FOUND);
            }
        }
    } else {
        None
    };
    let slots: Vec<std::sync::Mutex<Option<Conn>>> = conns.into_iter().map(std::sync::Mutex::new).collect();
    let results = each_remote(spec, |h| {
        let conn = slots[h].lock().ok().and_then(|mut c| c.take()).ok_or("no connection")?;
        ssh::start_agent(conn, &spec.remote_cclrun, &host_job(spec, h, id, true))
    });
    let agents = report(spec, results, NOT_FOUND)?;
    Ok(Started { agents, local_program })
}
