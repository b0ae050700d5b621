//! The host's watch over device work that ccl queued and returned from.
//!
//! A device collective returns once its work is queued; its streams then
//! wait on flags that peers' streams write. If a peer's process dies, or
//! never runs its part, those waits would hold the stream forever (a real
//! GPU's stream wait has no deadline). So every such call is handed to one
//! thread per process that watches it until its stream has run it: while
//! it has not, the thread asks whether the peers it waits on are alive,
//! and once one is lost, or the call's deadline (`CCL_TIMEOUT`) has
//! passed, it releases the waits: it sets every flag the call waits on to
//! [`RELEASED`], which both sides of a slot take as their turn, and again
//! at each look (the stream's own writes undo it) until the stream has run
//! to its end (with wrong data). It also marks every connection the call
//! used as poisoned (a word beside the slots' flags, set before the
//! release, so before any wrong data leaves): a peer whose own call ends
//! normally, but on data from a released one, finds the mark when its call
//! is done and fails too. The next synchronisation of the stream reports
//! why ([`Stream::synchronize`]), after a look of its own, so that no
//! wrong result passes for a right one.

use super::Stream;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What a released flag holds: a value that both a slot's sender (waiting
/// for bit 0 clear: empty) and its receiver (waiting for bit 0 or 1 set:
/// full) take as their turn.
pub(crate) const RELEASED: u64 = 2;

/// What a poisoned connection's mark holds.
pub(crate) const POISONED: u64 = 0x6363_6c2d_706f_6973;

/// How often the watch looks at the calls in flight.
const EVERY: Duration = Duration::from_millis(10);

/// One device call in flight.
pub(crate) struct InFlight {
    /// The stream the call ends on.
    pub stream: Stream,
    /// The device addresses of the flags its streams wait on, each with
    /// the value that releases it.
    pub flags: Vec<(u64, u64)>,
    /// The poison marks of the connections it used, and the peer of each.
    pub marks: Vec<(u64, usize)>,
    /// `Ok` while the peers it waits on are alive.
    pub alive: Box<dyn Fn() -> Result<()> + Send>,
    /// When it fails though every peer is alive.
    pub deadline: Instant,
    /// The call, for messages: `all_reduce #3 at rank 0`.
    pub what: String,
    /// Why to release its waits at once (the call failed on the host after
    /// queueing part of its work, which may wait for what never comes).
    pub abandoned: Option<&'static str>,
    /// Whether its waits are being released.
    pub released: bool,
}

#[derive(Default)]
struct Watch {
    calls: Mutex<Vec<InFlight>>,
    /// Rung when a call is handed over: the thread sleeps on it while
    /// there is nothing to watch.
    handed: std::sync::Condvar,
    /// Why a stream's work was released, by (context, stream), until a
    /// synchronisation of the stream reports it.
    failed: Mutex<Vec<(u64, u64, Error)>>,
}

static WATCH: OnceLock<Arc<Watch>> = OnceLock::new();

fn the_watch() -> &'static Arc<Watch> {
    WATCH.get_or_init(|| {
        let w = Arc::new(Watch::default());
        let w2 = Arc::clone(&w);
        let _ = std::thread::Builder::new().name("ccl-gpu-watch".into()).spawn(move || loop {
            {
                let calls = w2.calls.lock().unwrap_or_else(|e| e.into_inner());
                drop(w2.handed.wait_while(calls, |c| c.is_empty()).unwrap_or_else(|e| e.into_inner()));
            }
            std::thread::sleep(EVERY);
            w2.look();
        });
        w
    })
}

impl Watch {
    fn look(&self) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        calls.retain_mut(|c| {
            let dev = Arc::clone(c.stream.dev());
            let fail = |c: &InFlight, why: String| {
                record(&self.failed, &c.stream, || Error::device(format!("{}: {why}", c.what)))
            };
            match c.stream.query() {
                Ok(false) => {}
                Ok(true) if !c.released => {
                    // done: but on data of a peer whose work was released?
                    let poisoned = c.marks.iter().find(|(m, _)| dev.read_word(*m).is_ok_and(|w| w == POISONED));
                    if let Some((_, peer)) = poisoned {
                        fail(
                            c,
                            format!(
                                "peer {peer}'s device work was released (a rank it waited on is gone), and \
                                         its data reached this rank: the results are wrong"
                            ),
                        );
                    }
                    return false;
                }
                // finished, or failed on its own (the stream reports that)
                _ => return false,
            }
            if !c.released {
                let why = match (c.abandoned, (c.alive)()) {
                    (Some(why), _) => why.to_string(),
                    (None, Err(e)) => format!("the GPU waited on a peer that is gone ({e})"),
                    (None, Ok(())) if now >= c.deadline => {
                        "the GPU waited longer than CCL_TIMEOUT for its peers' part".into()
                    }
                    (None, Ok(())) => return true,
                };
                fail(&*c, format!("{why}; its device work was released and its results are wrong"));
                c.released = true;
                for &(m, _) in &c.marks {
                    // SAFETY: as for the flags below; a word of its own.
                    let _ = unsafe { dev.write_word(m, POISONED) };
                }
            }
            for &(f, v) in &c.flags {
                // SAFETY: a flag word of a connection's slot memory (or of
                // the communicator's proxy words), kept mapped while calls
                // use it; the communicator is failed from now on, so what
                // its flags hold no longer matters.
                let _ = unsafe { dev.write_word(f, v) };
            }
            true
        });
    }
}

/// Watches `call` until its stream has run it.
pub(crate) fn watch(call: InFlight) {
    let w = the_watch();
    w.calls.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    w.handed.notify_one();
}

/// Records that a call ordered on `stream` failed on the host (a call
/// the communicator's proxy finishes after it returned): the next
/// synchronisation of the stream reports `err`, unless an earlier failure
/// of the stream is still unreported.
pub(crate) fn report(stream: &Stream, err: Error) {
    record(&the_watch().failed, stream, || err);
}

/// Notes why `stream`'s work failed, unless a failure of it is noted and
/// not yet reported (one call's failure, seen twice, is reported once).
fn record(failed: &Mutex<Vec<(u64, u64, Error)>>, stream: &Stream, err: impl FnOnce() -> Error) {
    let mut failed = failed.lock().unwrap_or_else(|e| e.into_inner());
    let key = (stream.dev().context(), stream.raw());
    if !failed.iter().any(|(c, s, _)| (*c, *s) == key) {
        failed.push((key.0, key.1, err()));
    }
}

/// Why work on `stream` was released, or ran on released data, once (see
/// the module docs); after a look at every call in flight.
pub(crate) fn failure(stream: &Stream) -> Option<Error> {
    let w = WATCH.get()?;
    w.look();
    let mut failed = w.failed.lock().unwrap_or_else(|e| e.into_inner());
    let key = (stream.dev().context(), stream.raw());
    let i = failed.iter().position(|(c, s, _)| (*c, *s) == key)?;
    Some(failed.swap_remove(i).2)
}
