//! Who gives way when strangers flood a listener: connections accepted but
//! not yet authenticated are bounded per source address and in all, and a
//! newcomer beyond either bound pushes out the oldest unauthenticated
//! connection of the source that holds the most. A connection that has
//! proved the job's key is never pushed out; one that is pushed out is
//! retried by its sender (the rendezvous' ranks, the tcp transport's
//! senders), so a flood delays a rank but never loses it. Used by the
//! rendezvous and by every rank's tcp listener.
//!
//! What is dropped is said on stderr at most once a second per listener
//! kind, with a count of what went unsaid ([`DropLog`]).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bounds on unauthenticated connections: per source address, and in all.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// From one address.
    pub per_source: usize,
    /// From every address together.
    pub total: usize,
}

/// What the policy needs to know of a waiting connection.
pub trait Waiting {
    /// Its source address.
    fn source(&self) -> IpAddr;
    /// When it was accepted.
    fn since(&self) -> Instant;
    /// Whether it has proved the job's key (never pushed out).
    fn proved(&self) -> bool;
}

/// The connection of `waiting` to push out so that a newcomer from `from`
/// fits `caps`, if one must go: the oldest unproved one from `from` where
/// that source is at its cap, else, where all are at theirs, the oldest
/// unproved one of the source holding the most. `None` where nothing need
/// go, or where only proved connections are left (the newcomer then waits
/// its turn in the caller's way, or goes itself).
pub fn victim<W: Waiting>(waiting: &[W], from: IpAddr, caps: Caps) -> Option<usize> {
    if waiting.len() < caps.per_source.min(caps.total) {
        return None;
    }
    let unproved = || waiting.iter().enumerate().filter(|(_, w)| !w.proved());
    let oldest_of = |ip: IpAddr| unproved().filter(|(_, w)| w.source() == ip).min_by_key(|(_, w)| w.since());
    let same = unproved().filter(|(_, w)| w.source() == from).count();
    if same >= caps.per_source {
        return oldest_of(from).map(|(i, _)| i);
    }
    if waiting.len() < caps.total {
        return None;
    }
    let mut per: std::collections::HashMap<IpAddr, usize> = Default::default();
    for (_, w) in unproved() {
        *per.entry(w.source()).or_default() += 1;
    }
    let busiest = per.into_iter().max_by_key(|&(_, n)| n)?.0;
    oldest_of(busiest).map(|(i, _)| i)
}

/// Connections a listener's kernel queue holds before it drops new ones:
/// far more than a rank's peers, so that a flood of strangers, which the
/// listener accepts and pushes out as fast as it can, leaves room for
/// them (the kernel caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 4096;

/// Deepens `l`'s queue of connections not yet accepted to `BACKLOG`
/// (Rust's listeners start with 128); where that fails, it stays as it is.
pub fn deepen_backlog(l: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen() again on a listening socket this listener owns only
    // changes its queue's length.
    unsafe { libc::listen(l.as_raw_fd(), BACKLOG) };
}

/// A line on stderr for each connection dropped, at most one a second,
/// with how many went unsaid since the last: a flood of strangers cannot
/// flood the job's output too.
pub struct DropLog {
    what: &'static str,
    last: Mutex<Option<Instant>>,
    unsaid: AtomicU64,
}

impl DropLog {
    /// A log whose lines start `ccl: WHAT:`.
    pub const fn new(what: &'static str) -> Self {
        DropLog { what, last: Mutex::new(None), unsaid: AtomicU64::new(0) }
    }

    /// Says that a connection from `from` was dropped and why, unless a
    /// line was said less than a second ago (then counts it).
    pub fn dropped(&self, from: impl std::fmt::Display, why: &dyn std::fmt::Display) {
        self.note(&format_args!("dropped connection from {from}: {why}"));
    }

    /// Says `what` happened, unless a line was said less than a second ago
    /// (then counts it).
    pub fn note(&self, what: &dyn std::fmt::Display) {
        if let Some(line) = self.line(what) {
            eprintln!("{line}");
        }
    }

    fn line(&self, text: &dyn std::fmt::Display) -> Option<String> {
        let Ok(mut last) = self.last.lock() else { return None };
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            self.unsaid.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(Instant::now());
        let what = self.what;
        Some(match self.unsaid.swap(0, Ordering::Relaxed) {
            0 => format!("ccl: {what}: {text}"),
            n => format!("ccl: {what}: {text} (and {n} more since the last such line)"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct W(IpAddr, u64, bool);
    impl Waiting for W {
        fn source(&self) -> IpAddr {
            self.0
        }
        fn since(&self) -> Instant {
            static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            *BASE.get_or_init(Instant::now) + Duration::from_millis(self.1)
        }
        fn proved(&self) -> bool {
            self.2
        }
    }

    #[test]
    fn the_busiest_source_gives_way_and_the_proved_never_do() {
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let caps = Caps { per_source: 3, total: 5 };
        // room for a newcomer
        assert_eq!(victim(&[W(a, 0, false), W(b, 1, false)], a, caps), None);
        // a's cap reached: a's oldest unproved goes, not the proved older one
        let w = [W(a, 0, true), W(a, 1, false), W(a, 2, false), W(a, 3, false), W(b, 4, false)];
        assert_eq!(victim(&w, a, caps), Some(1));
        // all full: the busiest source (a) gives way even to b
        let w = [W(b, 0, false), W(a, 1, false), W(a, 2, false), W(b, 3, true), W(a, 4, false)];
        assert_eq!(victim(&w, b, caps), Some(1));
        // only proved ones left: none goes
        let w = [W(a, 0, true), W(a, 1, true), W(a, 2, true), W(b, 3, true), W(b, 4, true)];
        assert_eq!(victim(&w, a, caps), None);
    }

    #[test]
    fn a_flood_is_said_once_a_second_with_a_count() {
        let log = DropLog::new("test");
        assert_eq!(log.line(&"dropped x").as_deref(), Some("ccl: test: dropped x"));
        for _ in 0..1000 {
            assert!(log.line(&"dropped x").is_none());
        }
        *log.last.lock().expect("lock") = Some(Instant::now() - Duration::from_secs(2));
        let l = log.line(&"dropped y").expect("a line again after a second");
        assert!(l.ends_with("(and 1000 more since the last such line)"), "{l}");
    }
}
