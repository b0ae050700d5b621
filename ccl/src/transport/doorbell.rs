//! A doorbell: a counter a rank sleeps on and its peers ring.
//!
//! Waiting follows spin → yield → sleep: a rank that cannot move re-polls a
//! few times, then yields its core, then sleeps on a futex until a peer
//! rings (or a short timeout passes, so deadlines and aborts are seen).
//! Ringing is one atomic add, plus a `FUTEX_WAKE` only when someone sleeps.
//! The counter is plain memory, so the same code works between processes
//! once it lives in a shared mapping.

use super::sync::{store_load_order, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a peer rings to wake a rank: its doorbell, and whatever else
/// wakes it while it sleeps elsewhere than on the doorbell's futex.
pub trait Bell: Send + Sync {
    /// The doorbell itself.
    fn doorbell(&self) -> &Doorbell;
    /// Wakes whoever sleeps on this bell.
    fn ring(&self) {
        self.doorbell().ring();
    }
}

/// A shared handle on a doorbell, wherever it lives (the heap for threads,
/// a shared mapping for processes).
pub type BellRef = Arc<dyn Bell>;

impl Bell for Doorbell {
    fn doorbell(&self) -> &Doorbell {
        self
    }
}

/// A futex-backed wake-up counter.
#[repr(C)]
pub struct Doorbell {
    seq: AtomicU32,
    sleepers: AtomicU32,
    /// Owners sleeping in `poll()` instead of on the futex
    /// ([`poll_while`](Self::poll_while)).
    pollers: AtomicU32,
    /// Under loom, the futex: a sleeper compares and sleeps under the lock
    /// a waker takes, as the kernel does under its hash bucket's.
    #[cfg(loom)]
    futex: (loom::sync::Mutex<()>, loom::sync::Condvar),
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Doorbell({})", self.seq.load(Ordering::Relaxed))
    }
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}

impl Doorbell {
    /// A new doorbell.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Doorbell { seq: AtomicU32::new(0), sleepers: AtomicU32::new(0), pollers: AtomicU32::new(0) }
    }

    /// A new doorbell.
    #[cfg(loom)]
    pub fn new() -> Self {
        Doorbell {
            seq: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            pollers: AtomicU32::new(0),
            futex: Default::default(),
        }
    }

    /// The current count; read it *before* looking for work, then pass it
    /// to [`sleep`](Self::sleep) so a ring in between is not lost.
    pub fn seq(&self) -> u32 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Wakes whoever sleeps on this bell.
    pub fn ring(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        store_load_order();
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.wake_sleepers();
        }
    }

    /// Sleeps until the count differs from `seen` or `timeout` passes.
    pub fn sleep(&self, seen: u32, timeout: Duration) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        store_load_order();
        if self.seq.load(Ordering::SeqCst) == seen {
            self.wait_on(seen, timeout);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Runs `poll` (a sleep that a ring wakes some other way: see
    /// [`polling`](Self::polling)) unless the count already differs from
    /// `seen`. A ring either comes before the check, or sees the poller.
    pub fn poll_while(&self, seen: u32, poll: impl FnOnce()) {
        self.pollers.fetch_add(1, Ordering::SeqCst);
        store_load_order();
        if self.seq.load(Ordering::SeqCst) == seen {
            poll();
        }
        self.pollers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether the owner sleeps in [`poll_while`](Self::poll_while): a ring
    /// must then wake it the other way too (ring first, then ask).
    pub fn polling(&self) -> bool {
        self.pollers.load(Ordering::SeqCst) > 0
    }
}

impl Doorbell {
    #[cfg(not(loom))]
    fn wait_on(&self, seen: u32, timeout: Duration) {
        futex_wait(&self.seq, seen, timeout);
    }

    #[cfg(not(loom))]
    fn wake_sleepers(&self) {
        futex_wake(&self.seq);
    }

    /// Under loom a sleep has no timeout: a lost wake-up is a deadlock
    /// that loom reports.
    #[cfg(loom)]
    fn wait_on(&self, seen: u32, _timeout: Duration) {
        let (lock, cv) = &self.futex;
        let Ok(g) = lock.lock() else { return };
        if self.seq.load(Ordering::SeqCst) == seen {
            drop(cv.wait(g));
        }
    }

    #[cfg(loom)]
    fn wake_sleepers(&self) {
        let (lock, cv) = &self.futex;
        let _g = lock.lock();
        cv.notify_all();
    }
}

#[cfg(all(target_os = "linux", not(loom)))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 for the duration of the call and
    // `ts` outlives it; FUTEX_WAIT only reads both. Spurious returns (EINTR,
    // EAGAIN, ETIMEDOUT) are fine: callers re-check their condition.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

#[cfg(all(target_os = "linux", not(loom)))]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE touches no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(not(any(target_os = "linux", loom)))]
fn futex_wait(_word: &AtomicU32, _expected: u32, timeout: Duration) {
    std::thread::sleep(timeout.min(Duration::from_micros(200)));
}

#[cfg(not(any(target_os = "linux", loom)))]
fn futex_wake(_word: &AtomicU32) {}

/// The escalating wait of one blocked rank.
#[derive(Debug)]
pub struct Backoff {
    step: u32,
    /// Re-polls before yielding (for a rank with a core of its own: until
    /// [`SPIN_DEDICATED`] has passed since its first clock reading, then
    /// the count reached).
    spins: u32,
    own_core: bool,
    /// When this wait's spinning began (a rank with a core of its own).
    since: Option<Instant>,
}

/// Re-polls before yielding when ranks share cores: short, so the rank
/// that would make progress gets the core.
const SPINS: u32 = 64;
/// The same where polling reads sockets, each poll a system call per
/// socket: 64 of them held the core long enough to slow every hand-off
/// (`bench/results/spin.md`).
const SPINS_ON_SOCKETS: u32 = 4;
/// How long a rank with a core of its own re-polls before yielding: longer
/// than a futex round trip, or two such ranks fall into waking each other
/// from sleep on every call, as a count of polls without pauses did
/// (`bench/results/spin.md`).
const SPIN_DEDICATED: Duration = Duration::from_millis(1);
/// Polls between readings of the clock while spinning.
const CLOCK_EVERY: u32 = 64;
/// Yields before sleeping.
const YIELDS: u32 = 8;
/// Longest single sleep: bounds how late a deadline or abort is noticed.
const MAX_SLEEP: Duration = Duration::from_millis(50);

impl Backoff {
    /// A fresh backoff (spinning first) for a rank with a core of its own
    /// (`own_core`) or one sharing cores with other ranks, which polls
    /// `sockets` or only memory.
    pub fn new(own_core: bool, sockets: bool) -> Self {
        let spins = match (own_core, sockets) {
            (true, _) => u32::MAX,
            (false, false) => SPINS,
            (false, true) => SPINS_ON_SOCKETS,
        };
        Backoff { step: 0, spins, own_core, since: None }
    }

    /// Progress was made: start again from spinning.
    pub fn reset(&mut self) {
        self.step = 0;
        if self.own_core {
            self.spins = u32::MAX;
            self.since = None;
        }
    }

    /// Whether the next [`snooze`](Self::snooze) only spins.
    pub fn spinning(&self) -> bool {
        self.step < self.spins
    }

    /// Waits a little longer than last time: spins, then yields, then
    /// calls `sleep` with how long it may sleep (never past `deadline`,
    /// asked for only then).
    pub fn snooze(&mut self, deadline: impl FnOnce() -> Instant, sleep: impl FnOnce(Duration)) {
        self.step = self.step.saturating_add(1);
        // the clock is first read after CLOCK_EVERY polls: a wait that ends
        // sooner (a small call's, most of them) never pays for it
        if self.own_core && self.spins == u32::MAX && self.step.is_multiple_of(CLOCK_EVERY) {
            match self.since {
                None => self.since = Some(Instant::now()),
                Some(since) if since.elapsed() >= SPIN_DEDICATED => self.spins = self.step - 1,
                Some(_) => {}
            }
        }
        if self.step <= self.spins {
            // a rank with a core of its own re-polls at once: a pause costs
            // more than the poll itself (measured: 8 B all_reduce 0.43 →
            // 0.37 µs on 2 ranks without it); ranks that share cores pause
            if !self.own_core {
                std::hint::spin_loop();
            }
        } else if self.step <= self.spins.saturating_add(YIELDS) {
            std::thread::yield_now();
        } else {
            let left = deadline().saturating_duration_since(Instant::now());
            sleep(left.min(MAX_SLEEP));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_ring_wakes_a_sleeper() {
        let bell = Arc::new(Doorbell::new());
        let seen = bell.seq();
        let b2 = Arc::clone(&bell);
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            while b2.seq() == seen {
                b2.sleep(seen, Duration::from_secs(10));
            }
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        bell.ring();
        let waited = t.join().expect("sleeper");
        assert!(waited < Duration::from_secs(10));
    }

    /// Snoozes until `b` first sleeps: how many snoozes that took.
    fn snoozes_to_sleep(b: &mut Backoff) -> u32 {
        let slept = std::cell::Cell::new(false);
        let mut n = 0;
        while !slept.get() {
            b.snooze(|| Instant::now() + Duration::from_secs(1), |_| slept.set(true));
            n += 1;
        }
        n
    }

    #[test]
    fn a_rank_with_a_core_of_its_own_spins_for_a_time_and_one_sharing_for_a_count() {
        let mut own = Backoff::new(true, false);
        let start = Instant::now();
        let n = snoozes_to_sleep(&mut own);
        assert!(start.elapsed() >= SPIN_DEDICATED, "slept after {:?} ({n} snoozes)", start.elapsed());
        assert!(!own.spinning());
        own.reset();
        assert!(own.spinning(), "progress starts the spinning again");
        let start = Instant::now();
        snoozes_to_sleep(&mut own);
        assert!(start.elapsed() >= SPIN_DEDICATED, "the time counts again from the reset");
        let mut shared = Backoff::new(false, false);
        assert_eq!(snoozes_to_sleep(&mut shared), SPINS + YIELDS + 1);
        shared.reset();
        assert_eq!(snoozes_to_sleep(&mut shared), SPINS + YIELDS + 1);
        // polling sockets: fewer polls, each a system call
        let mut on_sockets = Backoff::new(false, true);
        assert_eq!(snoozes_to_sleep(&mut on_sockets), SPINS_ON_SOCKETS + YIELDS + 1);
        let mut own_on_sockets = Backoff::new(true, true);
        let start = Instant::now();
        snoozes_to_sleep(&mut own_on_sockets);
        assert!(start.elapsed() >= SPIN_DEDICATED, "a core of its own spins its time on sockets too");
    }

    #[test]
    fn sleep_returns_at_once_when_rung_before() {
        let bell = Doorbell::new();
        let seen = bell.seq();
        bell.ring();
        bell.sleep(seen, Duration::from_secs(10)); // must not block
    }
}
