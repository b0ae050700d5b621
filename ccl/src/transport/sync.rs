//! The atomics of the lock-free transport code (the slot FIFO, the
//! doorbell), swapped for loom's under `cfg(loom)` so that loom can check
//! every interleaving and weak-memory outcome of them
//! (`scripts/loom.sh`).
//!
//! The stores that hand memory to the other side take their ordering from
//! [`publish`]; under loom a test can weaken it to `Relaxed`
//! (`weakened`) to show that its model notices.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU32, AtomicU64};
pub use std::sync::atomic::Ordering;
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicU32, AtomicU64};

/// The ordering of a store that hands memory to the other side: `Release`.
#[cfg(not(loom))]
#[inline(always)]
pub const fn publish() -> Ordering {
    Ordering::Release
}

#[cfg(loom)]
std::thread_local! {
    static WEAK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `Release`, or `Relaxed` inside `weakened`.
#[cfg(loom)]
pub fn publish() -> Ordering {
    if WEAK.with(std::cell::Cell::get) {
        Ordering::Relaxed
    } else {
        Ordering::Release
    }
}

/// Runs `f` with [`publish`] weakened to `Relaxed` (loom
/// runs a model's threads on the caller's thread).
#[cfg(loom)]
pub fn weakened<R>(f: impl FnOnce() -> R) -> R {
    WEAK.with(|w| w.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    WEAK.with(|w| w.set(false));
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Where the code relies on SeqCst accesses keeping a store before a
/// later load of another word (the doorbell's ring and sleep): nothing,
/// the accesses give that order. Loom models SeqCst accesses as AcqRel
/// only (tokio-rs/loom#180) and would report lost wake-ups that cannot
/// happen; under loom this is the SeqCst fence that restores the order.
#[inline(always)]
pub fn store_load_order() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}
