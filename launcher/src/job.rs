//! Running a job: hosts, rendezvous, ranks, output, supervision, cleanup.
//!
//! Other hosts are reached first, all in parallel, and their agents check
//! the program is there; only when every host is ready does any rank
//! start. When a rank fails (non-zero exit or a signal) or a host's
//! connection is lost, the others get a moment to notice the lost peer and
//! exit with their own error, then SIGTERM, then SIGKILL. cclrun exits with
//! the first failure's code (128 + signal for a signal, 255 for a lost
//! host). SIGINT and SIGTERM sent to cclrun are passed to every rank.

use crate::hosts::{self, Started};
use crate::spec::Spec;
use ccl::launch::JobFiles;
use ccl::launch::Rendezvous;
use ccl::launch::Shm;
use cclrun::proto::{Event, Msg, Order, Status};
use cclrun::spawn::{self, Ranks};
use std::io::Write;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

/// Time the surviving ranks get to report a lost peer themselves.
const NOTICE: Duration = Duration::from_secs(2);
/// Time between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(3);
/// Exit code for a lost host.
const HOST_LOST: i32 = 255;
/// How long after a rank fails cclrun waits for other failures before it
/// names the cause: a rank killed by a signal is the cause rather than the
/// ranks that reported losing it, whose exits may be noticed first.
const BLAME_WINDOW: Duration = Duration::from_millis(100);

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

fn describe(st: Status) -> String {
    match (st.code, st.signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signal_name(s)),
        _ => "ended".into(),
    }
}

fn exit_code(st: Status) -> i32 {
    st.code.unwrap_or_else(|| 128 + st.signal.unwrap_or(0))
}

/// What the supervisor hears.
pub enum Update {
    /// From a rank, on any host.
    Rank(Event),
    /// A remote host's agent finished (`Ok`) or its connection was lost.
    HostEnded(usize, Result<(), String>),
}

/// How to reach one host's ranks.
pub enum Control {
    /// Started here.
    Local(Ranks),
    /// Through that host's agent.
    Remote(Sender<Order>),
}

fn kill(ctl: &[Control], sig: i32) {
    for c in ctl {
        match c {
            Control::Local(r) => r.signal(sig),
            Control::Remote(tx) => {
                let _ = tx.send(Order::Signal(sig));
            }
        }
    }
}

/// Tells every host's ranks of the job of `files` that `lost` are gone, and why: a
/// rank waiting on them fails now, naming them, instead of when its own
/// link times out (a sender's, only after minutes of retransmissions).
fn note_lost(ctl: &[Control], files: &JobFiles, lost: &[usize], host: &str, why: &str) {
    for c in ctl {
        match c {
            Control::Local(_) => spawn::note_lost(files, lost, host, why),
            Control::Remote(tx) => {
                let _ = tx.send(Order::Lost { host: host.into(), ranks: lost.to_vec(), why: why.into() });
            }
        }
    }
}

fn write_line(err: bool, prefix: Option<&str>, line: &[u8]) {
    let mut out: Box<dyn Write> =
        if err { Box::new(std::io::stderr().lock()) } else { Box::new(std::io::stdout().lock()) };
    if let Some(p) = prefix {
        let _ = out.write_all(p.as_bytes());
    }
    let _ = out.write_all(line);
    let _ = out.flush();
}

/// Runs the job; the exit code for cclrun.
pub fn run(spec: &Spec) -> i32 {
    let np = spec.placement.len();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let conns = match hosts::connect_all(spec) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // ranks elsewhere reach the rendezvous at the address they reach us by
    let ip = conns.iter().flatten().map(|c| c.local_ip).next().unwrap_or([127, 0, 0, 1].into());
    let rv = match Rendezvous::bind(std::net::SocketAddr::new(ip, 0), np) {
        Ok(rv) => rv,
        Err(e) => {
            eprintln!("cclrun: {e}");
            return 1;
        }
    };
    let id = rv.id().clone();
    std::thread::spawn(Shm::sweep_stale);
    let (tx, rx) = mpsc::channel::<Update>();
    let Started { agents, local_program } = match hosts::prepare(spec, conns, &id) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let serve_for = spec.timeout.unwrap_or(Duration::from_secs(600));
    let server = std::thread::spawn(move || rv.serve(serve_for));
    // every host is ready: start the ranks
    let mut ctl = Vec::new();
    let mut pumps = Vec::new();
    for (h, agent) in agents.into_iter().enumerate() {
        match agent {
            Some(a) => {
                let (stx, srx) = mpsc::channel();
                ctl.push(Control::Remote(stx));
                let tx = tx.clone();
                pumps.push(std::thread::spawn(move || {
                    let fwd = tx.clone();
                    let r = a.run(srx, move |m| {
                        if let Msg::Event(e) = m {
                            let _ = fwd.send(Update::Rank(e));
                        }
                    });
                    let _ = tx.send(Update::HostEnded(h, r));
                }));
            }
            None => {
                let job = hosts::host_job(spec, h, &id, false);
                let (etx, erx) = mpsc::channel();
                let program = local_program.as_deref().unwrap_or(std::path::Path::new(&spec.program));
                let stop = || SIGNAL.load(Ordering::SeqCst) != 0;
                match spawn::spawn(&job, program, &etx, &stop) {
                    Ok(r) => ctl.push(Control::Local(r)),
                    Err(e) => {
                        kill(&ctl, libc::SIGKILL);
                        spawn::remove_shm_files(&id.files());
                        return match SIGNAL.load(Ordering::SeqCst) {
                            0 => {
                                eprintln!("cclrun: {e}");
                                127
                            }
                            sig => {
                                eprintln!("cclrun: got {} while starting ranks: {e}; ending the job", signal_name(sig));
                                128 + sig
                            }
                        };
                    }
                }
                let tx = tx.clone();
                std::thread::spawn(move || erx.into_iter().for_each(|e| drop(tx.send(Update::Rank(e)))));
            }
        }
    }
    drop(tx);
    let code = supervise(spec, &ctl, &rx, &id.files());
    drop(ctl); // remote agents see no more signals; their pumps end at DONE
    for p in pumps {
        let _ = p.join();
    }
    spawn::remove_shm_files(&id.files());
    if server.is_finished() && code == 0 {
        if let Ok(Err(e)) = server.join() {
            eprintln!("cclrun: {e}");
        }
    }
    code
}

/// Watches the ranks until all have ended; the job's exit code.
fn supervise(spec: &Spec, ctl: &[Control], rx: &mpsc::Receiver<Update>, files: &JobFiles) -> i32 {
    let np = spec.placement.len();
    let start = Instant::now();
    let mut status: Vec<Option<Status>> = vec![None; np];
    let mut pid = vec![0u32; np];
    let mut first_fail: Option<(i32, Instant)> = None;
    let mut term_at: Option<Instant> = None;
    let mut forwarded: Option<i32> = None;
    let mut timed_out = false;
    let show = hosts::on_terminal(spec);
    let mut started = 0;
    let quiet = |ff: &Option<(i32, Instant)>, fw: &Option<i32>, to: bool| ff.is_none() && fw.is_none() && !to;
    // failures seen while deciding which one caused the others
    let mut failed: Vec<(usize, Status)> = Vec::new();
    let mut window: Option<Instant> = None;
    while status.iter().any(Option::is_none) || window.is_some() {
        let mut next = rx.recv_timeout(Duration::from_millis(20)).ok();
        while let Some(u) = next {
            match u {
                Update::Rank(Event::Started { rank, pid: p }) => {
                    pid[rank] = p;
                    started += 1;
                    if show {
                        let end = if started == np { "\n" } else { "" };
                        eprint!("\rcclrun: ranks started {started}/{np}{end}");
                    }
                }
                Update::Rank(Event::Output { rank, err, line }) => {
                    write_line(err, spec.tag_output.then(|| format!("[{rank}] ")).as_deref(), &line)
                }
                Update::Rank(Event::Exit { rank, status: st }) => {
                    if status[rank].is_none() {
                        status[rank] = Some(st);
                        if !st.success() {
                            failed.push((rank, st));
                            window.get_or_insert_with(Instant::now);
                        }
                    }
                }
                Update::HostEnded(_, Ok(())) => {}
                Update::HostEnded(h, Err(why)) => {
                    let lost: Vec<usize> =
                        (0..np).filter(|&r| spec.placement[r].host == h && status[r].is_none()).collect();
                    if !lost.is_empty() && quiet(&first_fail, &forwarded, timed_out) {
                        eprintln!("cclrun: host {}: {why}; ending the job", spec.host_names[h]);
                        first_fail = Some((HOST_LOST, Instant::now()));
                    }
                    if !lost.is_empty() {
                        let why = format!("cclrun lost its connection to it ({why})");
                        note_lost(ctl, files, &lost, &spec.host_names[h], &why);
                    }
                    for r in lost {
                        status[r] = Some(Status { code: Some(HOST_LOST), signal: None });
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        let all_ended = status.iter().all(Option::is_some);
        if window.is_some_and(|w| all_ended || w.elapsed() >= BLAME_WINDOW) {
            window = None;
            // a signal's victim first, else the first to fail
            if let Some(&(rank, st)) = failed.iter().find(|(_, st)| st.signal.is_some()).or(failed.first()) {
                if quiet(&first_fail, &forwarded, timed_out) {
                    let host = &spec.host_names[spec.placement[rank].host];
                    eprintln!("cclrun: rank {rank} (pid {}) on {host} {}; ending the job", pid[rank], describe(st));
                    first_fail = Some((exit_code(st), Instant::now()));
                }
            }
        }
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!("cclrun: got {}, passing it to every rank", signal_name(sig));
            kill(ctl, sig);
            forwarded = Some(sig);
            term_at.get_or_insert_with(Instant::now);
        }
        if let Some(limit) = spec.timeout {
            if !timed_out && start.elapsed() >= limit {
                eprintln!("cclrun: job timed out after {:.1} s; ending it", limit.as_secs_f64());
                timed_out = true;
                kill(ctl, libc::SIGTERM);
                term_at.get_or_insert_with(Instant::now);
            }
        }
        if let Some((_, at)) = first_fail {
            if term_at.is_none() && at.elapsed() >= NOTICE {
                kill(ctl, libc::SIGTERM);
                term_at = Some(Instant::now());
            }
        }
        if term_at.is_some_and(|t| t.elapsed() >= KILL_GRACE) {
            kill(ctl, libc::SIGKILL);
        }
    }
    match (timed_out, first_fail, forwarded) {
        (true, _, _) => 124,
        (_, Some((code, _)), _) => code,
        (_, None, Some(sig)) => 128 + sig,
        _ => status.iter().flatten().map(|s| exit_code(*s)).find(|&c| c != 0).unwrap_or(0),
    }
}
