//! The per-communicator queue of calls in flight.
//!
//! Calls start in the order they were made. Each pass advances every
//! queued call whose connections no earlier unfinished call still uses, so
//! a non-blocking send and receive to different peers progress together
//! while two collectives on the same links keep their order (which is what
//! lets every rank match messages FIFO). When nothing can move, the rank
//! backs off: spin, yield, then sleep on its doorbell until a peer rings,
//! the deadline passes, or the transport reports the job going down.

use crate::error::{Error, ErrorKind, Result};
use crate::exec::{Conns, Exec};
use crate::op::ReduceOp;
use crate::plan::fingerprint::Fingerprint;
use crate::transport::doorbell::Backoff;
use crate::Reduce;
use rustc_hash::FxHashSet as HashSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

/// How often a waiting rank asks whether the peers it waits on are alive.
const PEER_CHECK: Duration = Duration::from_micros(200);

/// How often a rank stuck in a call compares its last calls with those of
/// the peers it waits on ([`Conns::disagreement`]).
const CALLS_CHECK: Duration = Duration::from_millis(50);

/// Bumped by the SIGUSR1 handler: every waiting rank then prints its
/// pending calls to stderr.
pub(crate) static DUMP_REQUESTS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_sigusr1(_: libc::c_int) {
    DUMP_REQUESTS.fetch_add(1, Ordering::SeqCst);
}

/// Makes SIGUSR1 print every pending call of every waiting rank of this
/// process to stderr (what it waits for, and for how long), unless the
/// program already handles SIGUSR1. `ccl::init()` calls it.
pub fn install_dump_on_sigusr1() {
    // SAFETY: querying then installing a handler that only bumps an atomic,
    // which is async-signal-safe; an existing handler is left in place.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigusr1 as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut());
        }
    }
}

/// Idle spins between two reads of the clock while waiting.
const CLOCK_EVERY: u32 = 16;

/// Idle passes a blocking call with nothing queued ahead of it makes on
/// itself alone before it joins the queue's general wait, when the rank
/// has a core of its own (sharing one, it makes one: the rank that would
/// make progress may need the core).
const SOLO_PASSES: u32 = 256;

/// A call the engine can drive.
pub(crate) trait Pending: Send {
    fn advance(&mut self, conns: &mut Conns) -> Result<bool>;
    fn done(&self) -> bool;
    fn uses(&self) -> &[usize];
    fn waiting(&self) -> String;
    fn blocked_on(&self) -> Vec<usize>;
    /// Runs once when done: the finishing pass, then handing buffers back.
    fn complete(&mut self) -> Result<()>;
    /// Whether it waits on a GPU (no peer rings when that is done): the
    /// queue then polls instead of sleeping.
    fn on_gpu(&self) -> bool {
        false
    }
}

/// A collective or point-to-point call: an executor plus what to do at the end.
pub(crate) struct CallOp<T: Reduce, O: ReduceOp<T>> {
    pub exec: Exec<T, O>,
    pub finish_ranks: Option<usize>,
    pub on_done: Option<Box<dyn FnOnce() + Send>>,
}

impl<T: Reduce, O: ReduceOp<T>> Pending for CallOp<T, O> {
    fn advance(&mut self, conns: &mut Conns) -> Result<bool> {
        self.exec.advance(conns)
    }
    fn done(&self) -> bool {
        self.exec.done()
    }
    fn uses(&self) -> &[usize] {
        self.exec.uses()
    }
    fn waiting(&self) -> String {
        self.exec.waiting()
    }
    fn blocked_on(&self) -> Vec<usize> {
        self.exec.blocked_on()
    }
    fn on_gpu(&self) -> bool {
        self.exec.gpu_pending()
    }
    fn complete(&mut self) -> Result<()> {
        let r = match self.finish_ranks {
            Some(n) => self.exec.finish(n),
            None => Ok(()),
        };
        if let Some(f) = self.on_done.take() {
            f();
        }
        r
    }
}

/// A queued call: owned by the queue (non-blocking calls), or borrowed from
/// the frame of a blocking call that waits for it before returning.
enum OpRef {
    Owned(Box<dyn Pending>),
    Borrowed(NonNull<dyn Pending>),
}

impl OpRef {
    fn get(&self) -> &dyn Pending {
        match self {
            OpRef::Owned(b) => b.as_ref(),
            // SAFETY: a borrowed call is queued only by `Engine::run`, which
            // holds the `&mut` it came from and removes the entry before it
            // returns or unwinds, so the pointer is valid and unaliased here.
            OpRef::Borrowed(p) => unsafe { p.as_ref() },
        }
    }

    fn get_mut(&mut self) -> &mut dyn Pending {
        match self {
            OpRef::Owned(b) => b.as_mut(),
            // SAFETY: as in `get`; `&mut self` makes this the only access.
            OpRef::Borrowed(p) => unsafe { p.as_mut() },
        }
    }
}

// SAFETY: an owned call is `Send`; a borrowed one is a `dyn Pending`
// (`Send`) whose owner, blocked in `Engine::run`, does not touch it while
// the entry exists.
unsafe impl Send for OpRef {}

struct Entry {
    id: u64,
    op: OpRef,
    name: &'static str,
    seq: u64,
    timeout: Duration,
    /// When the call started and when it times out: stamped at submission
    /// for non-blocking calls, and for a blocking call the first time its
    /// wait reads the clock (within microseconds, but a call that finishes
    /// while spinning never reads it).
    clock: Option<(Instant, Instant)>,
}

impl Entry {
    /// The call's start and deadline, stamping them `now` if not yet.
    fn clock(&mut self, now: Instant) -> (Instant, Instant) {
        let timeout = self.timeout;
        // a deadline past what Instant can hold means "no deadline" in practice
        *self.clock.get_or_insert_with(|| {
            (now, now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX))))
        })
    }
}

/// The queue, the connections, and the results not yet collected.
/// Dropped, it drops its calls first: a device call's connections and
/// memory must outlive its work ([`Conns`]'s drop waits for it).
pub(crate) struct Engine {
    pub conns: Conns,
    rank: usize,
    queue: Vec<Entry>,
    /// Finished calls' results not yet collected (few: a list does).
    results: Vec<(u64, Result<()>)>,
    detached: HashSet<u64>,
    next: u64,
    broken: Option<String>,
    /// Whether this rank has a core of its own (it then spins longer and
    /// polls a lone call itself before queueing it).
    own_core: bool,
    aborted: Arc<AtomicBool>,
    dumps_seen: u32,
    chatty: bool,
    /// When a stuck call next compares calls with its peers.
    next_compare: std::cell::Cell<Instant>,
    /// The wakers of calls awaited as futures, by id (few: a list does).
    wakers: Vec<(u64, Waker)>,
    /// Whether a waker has been woken since [`drive_until`](Self::drive_until) last returned.
    woke: bool,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // (a device call left unfinished hands its queued work to the GPU
        // watch, which releases it: then the connections wait for it)
        self.queue.clear();
    }
}

impl Engine {
    /// An engine of a rank with a core of its own (`own_core`) or sharing
    /// one (see [`Backoff::new`]); `aborted` set from anywhere fails its calls;
    /// `chatty` prints a "still waiting" line every 10 s of a stuck call.
    pub fn new(conns: Conns, rank: usize, own_core: bool, aborted: Arc<AtomicBool>, chatty: bool) -> Self {
        Engine {
            conns,
            rank,
            queue: Vec::new(),
            results: Vec::new(),
            detached: HashSet::default(),
            next: 0,
            broken: None,
            own_core,
            aborted,
            dumps_seen: DUMP_REQUESTS.load(Ordering::Relaxed),
            chatty,
            next_compare: std::cell::Cell::new(Instant::now() + CALLS_CHECK),
            wakers: Vec::new(),
            woke: false,
        }
    }

    /// Refuses new calls after a failure or an abort.
    pub fn check_usable(&self) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Aborted));
        }
        match &self.broken {
            Some(why) => Err(Error::new(ErrorKind::Broken(why.clone()))),
            None => Ok(()),
        }
    }

    /// Queues a call; its id is what [`wait`](Self::wait) takes. Its
    /// `timeout` counts from now.
    pub fn submit(&mut self, op: Box<dyn Pending>, name: &'static str, seq: u64, timeout: Duration) -> Result<u64> {
        let id = self.enqueue(OpRef::Owned(op), name, seq, timeout)?;
        if let Some(e) = self.queue.last_mut() {
            e.clock(Instant::now());
        }
        Ok(id)
    }

    /// Queues `op` behind the calls in flight and drives the queue until
    /// it has finished; its result. Its `timeout` counts from the first
    /// time the wait reads the clock (a call that finishes while spinning
    /// never reads it). `op` stays in the caller's frame: nothing is boxed.
    pub fn run(
        &mut self,
        op: &mut (dyn Pending + 'static),
        name: &'static str,
        seq: u64,
        timeout: Duration,
    ) -> Result<()> {
        if self.queue.is_empty() {
            // nothing queued ahead of it: a few passes on this call alone
            // first, which finish a call whose peers are ahead or close
            // behind (or that has none) without queueing it, and react to
            // a peer's slot sooner than the general loop would
            self.check_usable()?;
            let passes = if self.own_core { SOLO_PASSES } else { 1 };
            let mut pass = 0;
            loop {
                let step = self.conns.flush().and_then(|()| op.advance(&mut self.conns));
                match step {
                    Ok(_) if op.done() => return op.complete().map_err(|e| e.in_call(name, seq).at_rank(self.rank)),
                    Ok(moved) => pass = if moved { 0 } else { pass + 1 },
                    Err(e) => {
                        let id = self.enqueue(OpRef::Borrowed(NonNull::from(op)), name, seq, timeout)?;
                        self.fail(self.queue.len() - 1, e);
                        return self.take(id).unwrap_or_else(|| Err(Error::internal("a failed call left no result")));
                    }
                }
                if pass >= passes || self.aborted.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
        let id = self.enqueue(OpRef::Borrowed(NonNull::from(op)), name, seq, timeout)?;
        // `wait` returns once the call is out of the queue (finished or
        // failed); the guard also takes it out if `wait` unwinds, so the
        // borrowed pointer never outlives this frame.
        struct Unlist<'a>(&'a mut Engine, u64);
        impl Drop for Unlist<'_> {
            fn drop(&mut self) {
                let id = self.1;
                if self.0.queue.iter().any(|e| e.id == id) {
                    // unwinding with the call in flight: its memory goes
                    // now, and what it left half done breaks the communicator
                    self.0.queue.retain(|e| e.id != id);
                    self.0.conns.forget_call_memory();
                    self.0.broken.get_or_insert_with(|| "a call was abandoned in flight (a panic)".into());
                }
            }
        }
        let guard = Unlist(self, id);
        guard.0.wait(id)
    }

    fn enqueue(&mut self, op: OpRef, name: &'static str, seq: u64, timeout: Duration) -> Result<u64> {
        self.check_usable()?;
        let id = self.next;
        self.next += 1;
        self.queue.push(Entry { id, op, name, seq, timeout, clock: None });
        Ok(id)
    }

    /// The result of call `id`, if it has finished and is not yet collected.
    fn take(&mut self, id: u64) -> Option<Result<()>> {
        let i = self.results.iter().position(|(k, _)| *k == id)?;
        Some(self.results.swap_remove(i).1)
    }

    fn store(&mut self, id: u64, r: Result<()>) {
        if self.detached.is_empty() || !self.detached.remove(&id) {
            self.results.push((id, r));
        }
        if let Some(i) = self.wakers.iter().position(|(k, _)| *k == id) {
            self.wakers.swap_remove(i).1.wake();
            self.woke = true;
        }
    }

    /// Wakes `waker` when call `id` finishes (a request awaited as a
    /// future), instead of any waker it had.
    pub fn set_waker(&mut self, id: u64, waker: &Waker) {
        match self.wakers.iter_mut().find(|(k, _)| *k == id) {
            Some((_, w)) => w.clone_from(waker),
            None => self.wakers.push((id, waker.clone())),
        }
    }

    /// Whether any call is awaited as a future.
    pub fn awaited(&self) -> bool {
        !self.wakers.is_empty()
    }

    /// Drives the queue until a call awaited as a future finishes (its
    /// waker woken), nothing is queued, or `until`.
    pub fn drive_until(&mut self, until: Instant) {
        self.woke = false;
        let _ = self.wait_for(None, Some(until));
    }

    /// Fails the call at `i` with `err`, and every other queued call with
    /// `Broken`; the communicator refuses further calls.
    fn fail(&mut self, i: usize, err: Error) {
        // the calls' memory goes back to their callers: nothing may still read it
        self.conns.forget_call_memory();
        if let ErrorKind::PeerLost { rank, .. } = err.kind() {
            self.conns.publish_lost(*rank);
        }
        let at = &self.queue[i];
        let err = err.in_call(at.name, at.seq).at_rank(self.rank);
        self.broken = Some(err.to_string());
        let entries: Vec<Entry> = self.queue.drain(..).collect();
        for (j, e) in entries.into_iter().enumerate() {
            let r = if j == i {
                Err(err.clone())
            } else {
                Err(Error::new(ErrorKind::Broken(err.to_string())).in_call(e.name, e.seq).at_rank(self.rank))
            };
            self.store(e.id, r);
        }
    }

    /// One pass over the queue; `true` if anything moved or finished.
    fn progress(&mut self) -> bool {
        // connections used by calls ahead in the queue (few: a list does)
        let mut busy: Vec<usize> = Vec::new();
        let mut moved = false;
        if let Err(e) = self.conns.flush() {
            if !self.queue.is_empty() {
                self.fail(0, e);
                return true;
            }
        }
        let mut i = 0;
        while i < self.queue.len() {
            let blocked = self.queue[i].op.get().uses().iter().any(|u| busy.contains(u));
            if !blocked {
                match self.queue[i].op.get_mut().advance(&mut self.conns) {
                    Ok(m) => moved |= m,
                    Err(e) => {
                        self.fail(i, e);
                        return true;
                    }
                }
                if self.queue[i].op.get().done() {
                    let mut e = self.queue.remove(i);
                    let r = e.op.get_mut().complete().map_err(|err| err.in_call(e.name, e.seq).at_rank(self.rank));
                    self.store(e.id, r);
                    moved = true;
                    continue;
                }
            }
            if i + 1 < self.queue.len() {
                busy.extend(self.queue[i].op.get().uses().iter().copied());
            }
            i += 1;
        }
        moved
    }

    /// Prints the pending calls (on SIGUSR1, or periodically when chatty).
    fn dump(&self, why: &str) {
        for e in &self.queue {
            eprintln!(
                "ccl: rank {} {why}: {} #{} pending for {:.1} s: {}",
                self.rank,
                e.name,
                e.seq,
                e.clock.map_or(0.0, |(started, _)| started.elapsed().as_secs_f64()),
                e.op.get().waiting()
            );
        }
    }

    /// Drives the queue until call `id` has finished; its result.
    pub fn wait(&mut self, id: u64) -> Result<()> {
        self.wait_until(id, None).unwrap_or_else(|| Err(Error::internal("a wait without an end returned")))
    }

    /// [`wait`](Self::wait), but returns `None` at `until` if call `id`
    /// has not finished by then (a proxy that lets other threads in).
    pub fn wait_until(&mut self, id: u64, until: Option<Instant>) -> Option<Result<()>> {
        self.wait_for(Some(id), until)
    }

    /// Drives the queue until call `id` has finished (its result), or
    /// with no `id` until a waker is woken or the queue is empty; `None`
    /// at `until`.
    fn wait_for(&mut self, id: Option<u64>, until: Option<Instant>) -> Option<Result<()>> {
        let mut backoff = Backoff::new(self.own_core, self.conns.any_pollable());
        // The clock is read only once the call has been idle a while (every
        // CLOCK_EVERY spins, and before every yield or sleep): a call that
        // completes while spinning never pays for it.
        let mut timers: Option<(Instant, Instant)> = None; // next "still waiting" note, next peer check
        let mut idle: u32 = 0;
        loop {
            match id {
                Some(id) => {
                    if let Some(r) = self.take(id) {
                        return Some(r);
                    }
                }
                None if self.woke || self.queue.is_empty() => return Some(Ok(())),
                None => {}
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return None;
            }
            if self.aborted.load(Ordering::SeqCst) && !self.queue.is_empty() {
                self.fail(0, Error::new(ErrorKind::Aborted));
                continue;
            }
            let dumps = DUMP_REQUESTS.load(Ordering::Relaxed);
            if dumps != self.dumps_seen {
                self.dumps_seen = dumps;
                self.dump("on SIGUSR1");
            }
            // the bell's count matters only to a sleep that may follow: while
            // spinning, leave its cache line to the peers that ring it
            let seen = if backoff.spinning() { 0 } else { self.conns.bell().seq() };
            if self.progress() {
                backoff.reset();
                idle = 0;
                continue;
            }
            idle = idle.wrapping_add(1);
            if !backoff.spinning() || idle.is_multiple_of(CLOCK_EVERY) {
                let now = Instant::now();
                self.queue.iter_mut().for_each(|e| {
                    e.clock(now);
                });
                let (next_note, next_check) = timers.get_or_insert((now + Duration::from_secs(10), now));
                if self.chatty && now >= *next_note {
                    *next_note += Duration::from_secs(10);
                    self.dump("still waiting");
                }
                // stuck: is someone we wait on gone? (then one more pass, in
                // case it posted its last data just before leaving). Asked at
                // most every PEER_CHECK, so spinning stays cheap.
                if now >= *next_check {
                    *next_check = now + PEER_CHECK;
                    if let Err(e) = self.check_peers() {
                        if !self.progress() && !self.queue.is_empty() {
                            self.fail(0, e);
                        }
                        continue;
                    }
                }
                // the oldest call's deadline: it is the one everything waits behind
                if let Some(first) = self.queue.first_mut() {
                    let (started, deadline) = first.clock(now);
                    if now >= deadline {
                        let secs = now.duration_since(started).as_secs_f64();
                        let waiting = first.op.get().waiting();
                        self.fail(0, Error::new(ErrorKind::Timeout { secs, waiting }));
                        continue;
                    }
                }
            }
            let i = match id {
                Some(id) => match self.queue.iter().position(|e| e.id == id) {
                    Some(i) => i,
                    None => return Some(Err(Error::internal(format!("no call {id} in flight")))),
                },
                // (woken, or nothing left: both seen at the top)
                None => 0,
            };
            // every call was stamped when the clock was last read, which it
            // is before any sleep
            let soonest = |e: &Entry| e.clock.map_or_else(Instant::now, |(_, d)| d);
            let (queue, conns) = (&self.queue, &self.conns);
            if queue.iter().any(|e| e.op.get().on_gpu()) {
                // no peer rings when a GPU is done: poll it, leaving the
                // core to whoever needs it between polls (an emulated
                // GPU's streams are threads)
                std::thread::yield_now();
                continue;
            }
            let deadline = || {
                let d = soonest(&queue[i]).min(soonest(&queue[0]));
                until.map_or(d, |u| d.min(u))
            };
            backoff.snooze(deadline, |d| conns.sleep(seen, d));
        }
    }

    /// Whether the peers this rank waits on are alive and made the same
    /// calls as it, as far as it can see ([`Conns::disagreement`]): a
    /// call its ranks disagree on may leave each waiting for messages the
    /// others never send.
    fn check_peers(&self) -> Result<()> {
        let mut peers: Vec<usize> = self.queue.iter().flat_map(|e| e.op.get().blocked_on()).collect();
        peers.sort_unstable();
        peers.dedup();
        let now = Instant::now();
        let compare = now >= self.next_compare.get();
        if compare {
            self.next_compare.set(now + CALLS_CHECK);
        }
        for &p in peers.iter().filter(|_| compare) {
            // a peer that cannot read this rank's calls is told them; one
            // out of reach is for the liveness check below
            let _ = self.conns.tell_calls(p);
            if let Some((ours, theirs)) = self.conns.disagreement(p) {
                return Err(Error::new(Fingerprint::mismatch(&ours, &theirs)).with_peer(p));
            }
        }
        self.conns.check_alive(&peers)
    }

    /// Advances once; the result of `id` if it has finished.
    pub fn test(&mut self, id: u64) -> Option<Result<()>> {
        if !self.progress() {
            if let Err(e) = self.check_peers() {
                if !self.progress() && !self.queue.is_empty() {
                    self.fail(0, e);
                }
            }
        }
        self.take(id)
    }

    /// Takes calls `ids` out of the queue, unfinished, as their buffers
    /// go (a caller unwinding while it waits for them): what they left
    /// half done breaks the communicator, as an abandoned blocking call does.
    pub fn abandon(&mut self, ids: &[u64]) {
        if self.queue.iter().any(|e| ids.contains(&e.id)) {
            self.queue.retain(|e| !ids.contains(&e.id));
            self.conns.forget_call_memory();
            self.broken.get_or_insert_with(|| "calls were abandoned in flight (a panic)".into());
        }
    }

    /// The caller no longer wants the result of `id` (it still completes).
    pub fn detach(&mut self, id: u64) {
        self.wakers.retain(|(k, _)| *k != id);
        if self.take(id).is_none() {
            self.detached.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::local::Fabric;
    use crate::transport::{Geometry, Registry, Transport};

    fn engine() -> Engine {
        let fabric = Fabric::new(1, 4, 4096);
        let ep: Arc<dyn Transport> = Arc::new(fabric.endpoint(0));
        let reg = Arc::new(Registry::new(vec![ep]).expect("registry"));
        let conns = Conns::new(reg, 0, 0, Arc::from([0usize]), Geometry { nslots: 4, slot_bytes: 4096 });
        Engine::new(conns, 0, false, Arc::new(AtomicBool::new(false)), false)
    }

    /// A call that needs `passes` passes, fails on pass `fail_at`, or
    /// panics on pass `panic_at`; it counts its passes and completions.
    #[derive(Default)]
    struct Fake {
        passes: u32,
        needs: u32,
        fail_at: Option<u32>,
        panic_at: Option<u32>,
        completed: u32,
    }

    impl Pending for Fake {
        fn advance(&mut self, _: &mut Conns) -> Result<bool> {
            self.passes += 1;
            if self.fail_at == Some(self.passes) {
                return Err(Error::new(ErrorKind::Aborted));
            }
            assert_ne!(self.panic_at, Some(self.passes), "pass {} panics", self.passes);
            Ok(true)
        }
        fn done(&self) -> bool {
            self.passes >= self.needs
        }
        fn uses(&self) -> &[usize] {
            &[]
        }
        fn waiting(&self) -> String {
            String::new()
        }
        fn blocked_on(&self) -> Vec<usize> {
            Vec::new()
        }
        fn complete(&mut self) -> Result<()> {
            self.completed += 1;
            Ok(())
        }
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn a_blocking_call_finishes_in_or_after_its_first_pass_and_completes_once() {
        let mut e = engine();
        for needs in [1, 3] {
            let mut f = Fake { needs, ..Fake::default() };
            e.run(&mut f, "all_reduce", 7, T).expect("finishes");
            assert_eq!((f.passes, f.completed), (needs, 1));
            assert!(e.queue.is_empty() && e.results.is_empty(), "nothing left behind");
        }
        // behind a queued call it waits its turn and both finish
        let id = e.submit(Box::new(Fake { needs: 2, ..Fake::default() }), "ireduce", 8, T).expect("queued");
        let mut f = Fake { needs: 1, ..Fake::default() };
        e.run(&mut f, "barrier", 9, T).expect("finishes");
        assert_eq!(f.completed, 1);
        assert!(e.wait(id).is_ok());
    }

    #[test]
    fn a_wait_with_an_end_returns_at_it_and_the_call_finishes_later() {
        let mut e = engine();
        let id = e.submit(Box::new(Fake { needs: 3, ..Fake::default() }), "all_reduce", 1, T).expect("queued");
        // an end already passed: no pass is made, the call stays queued
        assert!(e.wait_until(id, Some(Instant::now())).is_none());
        assert_eq!(e.queue.len(), 1);
        let far = Instant::now() + T;
        assert!(matches!(e.wait_until(id, Some(far)), Some(Ok(()))));
        assert!(e.queue.is_empty() && e.results.is_empty());
    }

    #[test]
    fn a_blocking_call_failing_in_its_first_pass_reports_itself_and_breaks_the_engine() {
        let mut e = engine();
        let mut f = Fake { needs: 5, fail_at: Some(1), ..Fake::default() };
        let err = e.run(&mut f, "all_reduce", 7, T).expect_err("fails");
        let msg = err.to_string();
        assert!(msg.contains("all_reduce") && msg.contains('7') && msg.contains("rank 0"), "{msg}");
        assert!(e.queue.is_empty(), "the borrowed call is not left queued");
        assert!(e.check_usable().is_err(), "later calls are refused");
    }

    #[test]
    fn a_blocking_call_that_unwinds_leaves_no_pointer_to_it_queued() {
        let mut e = engine();
        for panic_at in [1, 2] {
            let mut f = Fake { needs: 3, panic_at: Some(panic_at), ..Fake::default() };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.run(&mut f, "bcast", 1, T)));
            assert!(r.is_err(), "pass {panic_at} panicked");
            assert!(e.queue.is_empty(), "the borrowed call is not left queued");
        }
    }
}
