//! The slot FIFO and the doorbell under loom: every interleaving of a
//! sender and a receiver, and every value weak memory lets a load see.
//! Run by `scripts/loom.sh` (`RUSTFLAGS="--cfg loom"`).

use super::doorbell::{BellRef, Doorbell};
use super::fifo::{FifoMem, FifoRecv, FifoSend};
use super::sync;
use loom::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Messages through a FIFO of two slots: the third reuses the first slot.
const MESSAGES: u64 = 3;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// A sender and a receiver that sleep on their doorbells whenever they
/// cannot move, as the engine does: every message arrives whole, in
/// order, and nobody sleeps through a ring (a lost ring deadlocks).
fn pass_messages() {
    let mem = FifoMem::new(2, 64).expect("alloc");
    let sender_bell = Arc::new(Doorbell::new());
    let receiver_bell = Arc::new(Doorbell::new());
    let (sb, rb): (BellRef, BellRef) = (sender_bell.clone(), receiver_bell.clone());
    let mut tx = FifoSend::new(Arc::clone(&mem), rb);
    let mut rx = FifoRecv::new(mem, sb);
    let sender = loom::thread::spawn(move || {
        for i in 0..MESSAGES {
            loop {
                let seen = sender_bell.seq();
                if let Some(p) = tx.reserve(8, false) {
                    // SAFETY: a reserved slot is the sender's until posted; 64 bytes, aligned.
                    unsafe { (p as *mut u64).write(i) };
                    tx.post(8, &[i; 4]);
                    break;
                }
                sender_bell.sleep(seen, Duration::from_secs(1));
            }
        }
    });
    for i in 0..MESSAGES {
        loop {
            let seen = receiver_bell.seq();
            if let Some((p, len, fp)) = rx.peek() {
                assert_eq!((len, fp), (8, [i; 4]), "message {i}'s header");
                // SAFETY: a peeked slot holds the message until released.
                assert_eq!(unsafe { (p as *const u64).read() }, i);
                rx.release();
                break;
            }
            receiver_bell.sleep(seen, Duration::from_secs(1));
        }
    }
    sender.join().expect("sender");
}

#[test]
fn the_fifo_hands_every_slot_over_and_no_ring_is_lost() {
    model(pass_messages);
}

#[test]
fn the_model_catches_a_release_store_weakened_to_relaxed() {
    // with the slot's publishing store (and the tail's) relaxed, the
    // receiver may read a header or data not yet written
    let caught = sync::weakened(|| std::panic::catch_unwind(|| model(pass_messages)));
    let Err(payload) = caught else { panic!("loom found nothing wrong with relaxed hand-offs") };
    let what = payload.downcast_ref::<String>().map(String::as_str).or(payload.downcast_ref::<&str>().copied());
    assert!(what.is_some_and(|w| w.contains("Causality violation")), "caught something else: {what:?}");
}

#[test]
fn a_ring_wakes_a_sleeper_whatever_the_interleaving() {
    model(|| {
        let bell = Arc::new(Doorbell::new());
        let flag = Arc::new(AtomicBool::new(false));
        let (b2, f2) = (Arc::clone(&bell), Arc::clone(&flag));
        let waker = loom::thread::spawn(move || {
            f2.store(true, Ordering::Release);
            b2.ring();
        });
        loop {
            let seen = bell.seq();
            if flag.load(Ordering::Acquire) {
                break;
            }
            bell.sleep(seen, Duration::from_secs(1));
        }
        waker.join().expect("waker");
    });
}
