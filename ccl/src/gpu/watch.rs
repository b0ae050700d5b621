//! The host's watch over device work that ccl queued and returned from.
//!
//! A device collective returns once its work is queued; its streams then
//! wait on flags that peers' streams write. If a peer's process dies, or
//! never runs its part, those waits would hold the stream forever (a real
//! GPU's stream wait has no deadline). So every such call is handed to one
//! thread per process that watches it until its stream has run it: while
//! it has not, the thread asks whether the peers it waits on are alive,
//! and once one is lost, or the call's deadline (`CCL_TIMEOUT`) has
//! passed, it releases the waits by setting every flag the call waits on
//! past any count. The stream then runs to its end (with wrong data),
//! and the next synchronisation of the stream reports why
//! ([`Stream::synchronize`]).

use super::Stream;
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What a released flag holds: past any count a connection reaches.
pub(crate) const RELEASED: u64 = 1 << 62;

/// How often the watch looks at the calls in flight.
const EVERY: Duration = Duration::from_millis(10);

/// One device call in flight.
pub(crate) struct InFlight {
    /// The stream the call ends on.
    pub stream: Stream,
    /// The device addresses of the flags its streams wait on.
    pub flags: Vec<u64>,
    /// `Ok` while the peers it waits on are alive.
    pub alive: Box<dyn Fn() -> Result<()> + Send>,
    /// When it fails though every peer is alive.
    pub deadline: Instant,
    /// The call, for messages: `all_reduce #3 at rank 0`.
    pub what: String,
}

#[derive(Default)]
struct Watch {
    calls: Mutex<Vec<InFlight>>,
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
        calls.retain(|c| {
            if !matches!(c.stream.query(), Ok(false)) {
                // finished, or failed on its own (the stream reports that)
                return false;
            }
            let why = match (c.alive)() {
                Err(e) => e.to_string(),
                Ok(()) if now >= c.deadline => "its peers' part never ran on their GPUs (CCL_TIMEOUT)".into(),
                Ok(()) => return true,
            };
            let dev = c.stream.dev();
            for &f in &c.flags {
                // SAFETY: a flag word of a connection's slot memory, kept
                // mapped while calls use it; the values only grow, and the
                // communicator is failed from now on.
                let _ = unsafe { dev.write_word(f, RELEASED) };
            }
            let e = Error::device(format!(
                "{}: the GPU waited on a peer that is gone ({why}); its device work was released and its results \
                 are wrong",
                c.what
            ));
            let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
            failed.push((dev.context(), c.stream.raw(), e));
            false
        });
    }
}

/// Watches `call` until its stream has run it.
pub(crate) fn watch(call: InFlight) {
    the_watch().calls.lock().unwrap_or_else(|e| e.into_inner()).push(call);
}

/// Why work on `stream` was released, once (see the module docs).
pub(crate) fn failure(stream: &Stream) -> Option<Error> {
    let w = WATCH.get()?;
    let mut failed = w.failed.lock().unwrap_or_else(|e| e.into_inner());
    let key = (stream.dev().context(), stream.raw());
    let i = failed.iter().position(|(c, s, _)| (*c, *s) == key)?;
    Some(failed.swap_remove(i).2)
}
