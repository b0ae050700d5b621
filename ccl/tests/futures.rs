//! Requests awaited as futures: woken by the group's thread as their
//! calls finish (never by a timer), in any order, failing as `wait` fails,
//! and dropped unfinished without harm. Ranks as threads, on the simplest
//! executor: a thread parked until a waker unparks it.

use ccl::testing::LocalJob;
use ccl::{Config, ErrorKind, Sum};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::Duration;

/// Unparks the thread that polls, counting the wakes.
struct Unpark(std::thread::Thread, AtomicUsize);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.unpark();
    }
}

/// Runs `f` to completion, parking between polls (for at most 60 s in
/// all: a future nobody wakes fails the test instead of hanging it); its
/// output and the number of wakes.
fn block_on<F: Future>(f: F) -> (F::Output, usize) {
    let unpark = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0)));
    let waker = Arc::clone(&unpark).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return (v, unpark.1.load(Ordering::SeqCst));
        }
        assert!(std::time::Instant::now() < end, "a pending future was never woken");
        std::thread::park_timeout(end.saturating_duration_since(std::time::Instant::now()));
    }
}

fn config(timeout: Duration) -> Config {
    Config { timeout, buffsize: Some(16384), ..Config::default() }
}

#[test]
fn awaited_calls_are_woken_by_the_group_as_they_finish() {
    for n in [2, 3] {
        let out = LocalJob::new(n).config(config(Duration::from_secs(60))).run(|g| {
            let comm = g.typed::<f32>();
            // large enough to be in flight when first polled
            let big = comm.iall_reduce(vec![1.0; 1 << 20], Sum);
            let small = comm.iall_reduce(vec![2.0; 4], Sum);
            // awaited in the order they finish last-first
            let ((small, big), wakes) = block_on(async { (small.await, big.await) });
            (small.expect("small"), big.expect("big"), wakes)
        });
        for (small, big, wakes) in out {
            assert_eq!(small, vec![2.0 * n as f32; 4]);
            assert!(big.iter().all(|&x| x == n as f32));
            assert!(wakes >= 1, "finished without a wake: nothing was pending");
        }
    }
}

#[test]
fn an_awaited_call_fails_as_wait_would() {
    let out = LocalJob::new(3).config(config(Duration::from_millis(300))).run(|g| {
        if g.rank() == 2 {
            return None; // never joins
        }
        let r = block_on(g.typed::<f64>().iall_reduce(vec![1.0; 64], Sum)).0;
        Some(r.expect_err("rank 2 never joins"))
    });
    for e in out.into_iter().take(2).flatten() {
        assert!(matches!(e.kind(), ErrorKind::Timeout { .. }), "{e}");
    }
}

#[test]
fn a_future_dropped_unfinished_lets_its_call_finish_and_the_next_run() {
    let out = LocalJob::new(2).config(config(Duration::from_secs(60))).run(|g| {
        let comm = g.typed::<u32>();
        let mut first = Box::pin(comm.iall_reduce(vec![1; 1 << 18], Sum));
        // polled once (its waker registered, the group's thread started), then dropped
        let waker = Arc::new(Unpark(std::thread::current(), AtomicUsize::new(0))).into();
        let _ = first.as_mut().poll(&mut Context::from_waker(&waker));
        drop(first);
        let mut v = vec![g.rank() as u32 + 1; 8];
        comm.all_reduce(&mut v, Sum).expect("the next call");
        v
    });
    for v in out {
        assert_eq!(v, vec![3; 8]);
    }
}
