//! `cclrun agent`: runs one host's ranks for a cclrun on another host.
//!
//! Started over SSH with the channel as its stdin and stdout (see
//! [`crate::proto`]). It checks the job can run here, waits for `GO`,
//! starts the ranks, relays their output and exits, passes on signals and
//! the ranks cclrun gave up on (`spawn::note_lost`), and when its input
//! ends (cclrun or the link is gone) ends every rank: SIGTERM, then
//! SIGKILL after a grace period. No rank outlives it.

use crate::proto::{self, Event, HostJob, Msg, Order};
use crate::spawn;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest job line accepted.
const MAX_JOB: u64 = 16 << 20;
/// Time between SIGTERM and SIGKILL when cclrun is gone.
const GRACE: Duration = Duration::from_secs(3);

enum Input {
    Event(Event),
    Order(Order),
    Closed,
}

fn send(out: &mut impl Write, m: &Msg) -> bool {
    out.write_all(&proto::encode(m)).and_then(|()| out.flush()).is_ok()
}

/// Runs the agent on stdin/stdout; the process exit code.
pub fn main() -> i32 {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    if std::io::Read::take(&mut input, MAX_JOB).read_until(b'\n', &mut line).unwrap_or(0) == 0 {
        return 1; // nothing to do: cclrun went away
    }
    let job: HostJob = match serde_json::from_slice(&line) {
        Ok(j) => j,
        Err(e) => {
            send(&mut out, &Msg::Fail(format!("cclrun agent: bad job description: {e}")));
            return 2;
        }
    };
    if let Some(dir) = &job.cwd {
        if let Err(e) = std::env::set_current_dir(dir) {
            send(&mut out, &Msg::Fail(format!("working directory {dir}: {e}")));
            return 1;
        }
    }
    let program = match spawn::resolve(&job.program) {
        Ok(p) => p,
        Err(e) => {
            send(&mut out, &Msg::Fail(e));
            return 127;
        }
    };
    if !send(&mut out, &Msg::Ready) {
        return 1;
    }
    line.clear();
    if input.read_until(b'\n', &mut line).unwrap_or(0) == 0 || line.trim_ascii() != b"GO" {
        return 1; // cclrun gave up on the job (another host failed)
    }
    drop(input); // the reader thread below takes stdin over
    std::thread::spawn(ccl::launch::Shm::sweep_stale);
    let id = job.env.iter().find(|(k, _)| k == "CCL_UNIQUE_ID");
    let files = id.and_then(|(_, v)| ccl::launch::UniqueId::parse(v).ok()).map(|id| id.files());
    let (tx, rx) = mpsc::channel::<Input>();
    let (ev_tx, ev_rx) = mpsc::channel::<Event>();
    // the agent's own start is short (one host's ranks); cclrun's signals arrive once it runs
    let ranks = match spawn::spawn(&job, &program, &ev_tx, &|| false) {
        Ok(r) => r,
        Err(e) => {
            send(&mut out, &Msg::Fail(e));
            return 1;
        }
    };
    drop(ev_tx);
    let fwd = tx.clone();
    std::thread::spawn(move || {
        for e in ev_rx {
            let _ = fwd.send(Input::Event(e));
        }
    });
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for l in stdin.lock().split(b'\n') {
            let Ok(l) = l else { break };
            if let Some(o) = proto::decode_order(&l) {
                let _ = tx.send(Input::Order(o));
            }
        }
        let _ = tx.send(Input::Closed);
    });
    let mut left = job.ranks.len();
    let mut closed_at: Option<Instant> = None;
    while left > 0 {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Input::Event(e)) => {
                if matches!(e, Event::Exit { .. }) {
                    left -= 1;
                }
                if !send(&mut out, &Msg::Event(e)) && closed_at.is_none() {
                    ranks.signal(libc::SIGTERM);
                    closed_at = Some(Instant::now());
                }
            }
            Ok(Input::Order(Order::Signal(sig))) => ranks.signal(sig),
            Ok(Input::Order(Order::Lost { host, ranks, why })) => {
                if let Some(files) = &files {
                    spawn::note_lost(files, &ranks, &host, &why);
                }
            }
            Ok(Input::Closed) if closed_at.is_none() => {
                ranks.signal(libc::SIGTERM);
                closed_at = Some(Instant::now());
            }
            Ok(Input::Closed) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if closed_at.is_some_and(|t| t.elapsed() >= GRACE) {
            ranks.signal(libc::SIGKILL);
        }
    }
    if let Some(files) = &files {
        spawn::remove_shm_files(files);
    }
    send(&mut out, &Msg::Done);
    if closed_at.is_some() {
        1
    } else {
        0
    }
}
