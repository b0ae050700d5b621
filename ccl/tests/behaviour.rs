//! Errors for bad input, split, non-blocking progress, deadlines, and a
//! failing rank: ranks as threads.

mod common;

use ccl::testing::{run_local, LocalJob};
use ccl::{Config, ErrorKind, Max, Sum};
use std::time::{Duration, Instant};

fn quick(timeout_ms: u64) -> Config {
    Config { timeout: Duration::from_millis(timeout_ms), buffsize: Some(16384), ..Config::default() }
}

#[test]
fn bad_lengths_and_ranks_are_errors_naming_rank_and_call() {
    let out = run_local(3, |g| {
        let c = g.typed::<f32>();
        let mut small = vec![0.0; 2];
        let e1 = c.all_reduce_into(&[1.0; 3], &mut small, Sum).expect_err("recv too small");
        let e2 = c.reduce(&mut small, Sum, 3).expect_err("root out of range");
        let e3 = c.all_gather_in_place(&mut [0.0; 4]).expect_err("not divisible");
        let e4 = c.send(&[1.0], g.rank()).expect_err("self");
        let e5 = c.iall_to_all(vec![0.0; 5]).wait().expect_err("not divisible");
        let e6 = c.reduce_scatter(&[0.0; 5], &mut small, Max).expect_err("send size");
        // the communicator still works after argument errors
        let mut v = vec![1.0f32; 4];
        c.all_reduce(&mut v, Sum).expect("still usable");
        (g.rank(), [e1, e2, e3, e4, e5, e6], v)
    });
    for (rank, errs, v) in out {
        assert_eq!(v, vec![3.0; 4]);
        let [e1, e2, e3, e4, e5, e6] = errs;
        assert!(matches!(e1.kind(), ErrorKind::BufferSize { expected: 3, got: 2, .. }));
        assert!(e1.to_string().starts_with(&format!("rank {rank}, all_reduce #0: recv buffer holds 2")), "{e1}");
        assert!(matches!(e2.kind(), ErrorKind::RankOutOfRange { rank: 3, size: 3, .. }), "{e2}");
        assert!(e2.to_string().contains("reduce #1"), "{e2}");
        assert!(matches!(e3.kind(), ErrorKind::NotDivisible { len: 4, ranks: 3 }), "{e3}");
        assert!(matches!(e4.kind(), ErrorKind::InvalidArgument(_)), "{e4}");
        assert!(matches!(e5.kind(), ErrorKind::NotDivisible { .. }), "{e5}");
        assert!(matches!(e6.kind(), ErrorKind::BufferSize { what: "send buffer", .. }), "{e6}");
    }
}

#[test]
fn split_groups_by_color_and_orders_by_key() {
    let out = run_local(7, |g| {
        let color = if g.rank() == 6 { None } else { Some((g.rank() % 2) as u32) };
        let sub = g.split(color, -(g.rank() as i64)).expect("split");
        let Some(sub) = sub else {
            return (g.rank(), None);
        };
        let mut v = vec![g.rank() as u64; 5];
        sub.typed::<u64>().all_reduce(&mut v, Sum).expect("sub all_reduce");
        // a split of the split, and the parent still works alongside
        let subsub = sub.split(Some(0), 0).expect("split again").expect("member");
        subsub.barrier().expect("barrier");
        (g.rank(), Some((sub.rank(), sub.size(), v[0])))
    });
    for (rank, r) in out {
        match rank {
            6 => assert!(r.is_none()),
            _ => {
                let (sub_rank, size, sum) = r.expect("member");
                let members: Vec<usize> = (0..6).filter(|x| x % 2 == rank % 2).rev().collect();
                assert_eq!(size, 3);
                assert_eq!(members[sub_rank], rank, "ordered by key (descending rank)");
                assert_eq!(sum, members.iter().sum::<usize>() as u64);
            }
        }
    }
}

/// Both ranks post a large send before their receive: the engine must
/// progress the two concurrently or this deadlocks (each message is many
/// times a connection's capacity).
#[test]
fn nonblocking_send_and_recv_progress_together() {
    let job = LocalJob::new(2).config(quick(30_000));
    let out = job.run(|g| {
        let c = g.typed::<u32>();
        let peer = 1 - g.rank();
        let mine: Vec<u32> = (0..100_000).map(|i| i * 2 + g.rank() as u32).collect();
        let s = c.isend(mine, peer);
        let mut r = c.irecv(vec![0; 100_000], peer);
        // test() drives both requests; wait() then returns at once
        while !r.test().expect("test") {
            std::thread::yield_now();
        }
        let got = r.wait().expect("recv");
        s.wait().expect("send");
        got
    });
    for (rank, got) in out.iter().enumerate() {
        let peer = 1 - rank as u32;
        assert!(got.iter().enumerate().all(|(i, &x)| x == i as u32 * 2 + peer));
    }
}

#[test]
fn point_to_point_between_some_ranks_leaves_collectives_in_step() {
    let out = run_local(4, |g| {
        let c = g.typed::<u64>();
        let mut x = [g.rank() as u64];
        match g.rank() {
            0 => c.send(&x, 1).expect("send"),
            1 => c.recv(&mut x, 0).expect("recv"),
            _ => {}
        }
        let mut v = [1u64];
        c.all_reduce(&mut v, Sum).expect("collective after p2p on some ranks");
        (x[0], v[0])
    });
    assert_eq!(out, vec![(0, 4), (0, 4), (2, 4), (3, 4)]);
}

#[test]
fn several_requests_in_flight_complete_in_any_wait_order() {
    let out = run_local(4, |g| {
        let c = g.typed::<i64>();
        let reqs: Vec<_> = (0..5).map(|k| c.iall_reduce(vec![g.rank() as i64 + k; 1000], Sum)).collect();
        let b = g.ibarrier();
        let mut res: Vec<Vec<i64>> = reqs.into_iter().rev().map(|r| r.wait().expect("wait")).collect();
        b.wait().expect("barrier");
        res.reverse();
        res
    });
    for res in out {
        for (k, v) in res.iter().enumerate() {
            assert!(v.iter().all(|&x| x == 6 + 4 * k as i64));
        }
    }
}

#[test]
fn a_missing_peer_times_out_with_what_it_waits_for() {
    let job = LocalJob::new(3).config(quick(300));
    let out = job.run(|g| {
        let c = g.typed::<f64>();
        let mut v = vec![1.0; 10];
        if g.rank() == 2 {
            return None; // never joins
        }
        let t = Instant::now();
        let e = c.all_reduce(&mut v, Sum).expect_err("must time out");
        let after = c.all_reduce(&mut v, Sum).expect_err("broken afterwards");
        Some((e, after, t.elapsed()))
    });
    for (rank, r) in out.into_iter().enumerate().take(2) {
        let (e, after, took) = r.expect("ranks 0 and 1");
        assert!(matches!(e.kind(), ErrorKind::Timeout { .. }), "{e}");
        let s = e.to_string();
        assert!(s.starts_with(&format!("rank {rank}, all_reduce #0: timed out after 0.")), "{s}");
        assert!(s.contains("waiting"), "{s}");
        assert!(took < Duration::from_secs(10));
        assert!(matches!(after.kind(), ErrorKind::Broken(_)), "{after}");
    }
}

#[test]
fn mismatched_counts_are_reported_not_misread() {
    let job = LocalJob::new(2).config(quick(2000));
    let out = job.run(|g| {
        let c = g.typed::<u16>();
        if g.rank() == 0 {
            c.send(&[7u16; 10], 1).err()
        } else {
            let mut buf = [0u16; 6];
            c.recv(&mut buf, 0).err()
        }
    });
    let e = out[1].clone().expect("receiver fails");
    assert!(matches!(e.kind(), ErrorKind::Mismatch { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "rank 1, recv #0, peer 0: this rank called send/recv(6 × u16 of 2 B) #0 but the peer called send/recv(10 × u16 of 2 B) #0"
    );
}

#[test]
fn a_panicking_rank_fails_its_peers_instead_of_hanging() {
    let job = LocalJob::new(3).config(quick(60_000));
    let t = Instant::now();
    let r = std::panic::catch_unwind(|| {
        job.run(|g| {
            if g.rank() == 1 {
                panic!("rank 1 gives up");
            }
            let mut v = vec![0u8; 100];
            let e = g.typed::<u8>().all_reduce(&mut v, Sum).expect_err("peer gone");
            assert!(e.to_string().contains("rank 1 panicked"), "{e}");
        })
    });
    assert!(r.is_err(), "the panic is re-raised");
    assert!(t.elapsed() < Duration::from_secs(30), "peers noticed long before their deadline");
}

/// Ranks that make different calls fail on the first message, and the
/// error shows both calls, instead of hanging or misreading data.
#[test]
fn mismatched_calls_fail_with_both_fingerprints() {
    type Case = (&'static str, fn(&ccl::Group) -> ccl::Result<()>, &'static str);
    let cases: [Case; 5] = [
        (
            "another collective",
            |g| {
                let mut v = vec![1.0f32; 1000];
                if g.rank() == 1 {
                    g.typed::<f32>().broadcast(&mut v, 0)
                } else {
                    g.typed::<f32>().all_reduce(&mut v, Sum)
                }
            },
            "broadcast(1000 × f32 of 4 B, root 0) #0",
        ),
        (
            "another count",
            |g| {
                let mut v = vec![1.0f32; if g.rank() == 1 { 999 } else { 1000 }];
                g.typed::<f32>().all_reduce(&mut v, Sum)
            },
            "all_reduce(999 × f32 of 4 B, sum) #0",
        ),
        (
            "another type",
            |g| {
                if g.rank() == 1 {
                    g.typed::<i32>().all_reduce(&mut [1i32; 1000], Sum)
                } else {
                    g.typed::<f32>().all_reduce(&mut [1.0f32; 1000], Sum)
                }
            },
            "all_reduce(1000 × i32 of 4 B, sum) #0",
        ),
        (
            "another operator",
            |g| {
                let mut v = vec![1.0f32; 1000];
                if g.rank() == 1 {
                    g.typed::<f32>().all_reduce(&mut v, Max)
                } else {
                    g.typed::<f32>().all_reduce(&mut v, Sum)
                }
            },
            "all_reduce(1000 × f32 of 4 B, max) #0",
        ),
        (
            "another root",
            |g| {
                let mut v = vec![1u64; 100];
                g.typed::<u64>().broadcast(&mut v, if g.rank() == 1 { 2 } else { 0 })
            },
            "broadcast(100 × u64 of 8 B, root 2) #0",
        ),
    ];
    for (what, call, theirs) in cases {
        // rings, so that every rank's first receive comes from a rank that
        // made the other call (with trees, all may wait on a third rank)
        let job = LocalJob::new(3).config(ccl::Config { algo: Some(ccl::algo::Algo::Ring), ..quick(1500) });
        let out = job.run(|g| call(&g).err());
        let mismatch: Vec<_> =
            out.iter().flatten().filter(|e| matches!(e.kind(), ErrorKind::Mismatch { .. })).collect();
        assert!(!mismatch.is_empty(), "{what}: {out:?}");
        // rank 1's call shows in a mismatch error, as ours or as the peer's
        let shown = mismatch.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n");
        assert!(shown.contains(theirs) && shown.contains(" but the peer called "), "{what}: {shown}");
    }
}

#[test]
fn a_per_call_deadline_overrides_the_configured_one() {
    let job = LocalJob::new(2).config(quick(60_000));
    let out = job.run(|g| {
        if g.rank() == 1 {
            return None; // never joins
        }
        let t = Instant::now();
        let e = g.typed::<u32>().with_timeout(Duration::from_millis(300)).all_reduce(&mut [1u32; 8], Sum).err();
        Some((e, t.elapsed()))
    });
    let (e, took) = out[0].clone().expect("rank 0");
    let e = e.expect("times out");
    assert!(matches!(e.kind(), ErrorKind::Timeout { .. }), "{e}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // the barrier too
    let out = job.run(|g| {
        if g.rank() == 1 {
            return None;
        }
        g.typed::<u8>().with_timeout(Duration::from_millis(300)).barrier().err()
    });
    let e = out[0].clone().expect("times out");
    assert!(matches!(e.kind(), ErrorKind::Timeout { .. }) && e.to_string().contains("barrier"), "{e}");
    assert!(e.to_string().contains("timed out after 0.3 s"), "the per-call deadline, not the 60 s one: {e}");
}

#[test]
fn abort_from_another_thread_ends_a_blocked_call() {
    let job = LocalJob::new(2).config(quick(60_000));
    let out = job.run(|g| {
        if g.rank() == 1 {
            return None; // never joins
        }
        let watchdog = {
            let g = g.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                g.abort();
            })
        };
        let t = Instant::now();
        let first = g.typed::<f64>().all_reduce(&mut [1.0; 4], Sum).err();
        let took = t.elapsed();
        let _ = watchdog.join();
        let later = g.barrier().err();
        Some((first, later, took))
    });
    let (first, later, took) = out[0].clone().expect("rank 0");
    let first = first.expect("aborted");
    assert!(matches!(first.kind(), ErrorKind::Aborted), "{first}");
    assert!(first.to_string().starts_with("rank 0, all_reduce #0: the communicator was aborted"), "{first}");
    assert!(matches!(later.expect("refused").kind(), ErrorKind::Aborted));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A last call whose ranks disagreed on its root may return on each of
/// them; `finalize` finds it and returns it as a value (a drop would say
/// so and fail the process).
#[test]
fn finalize_returns_a_mismatch_that_no_call_returned() {
    for agree in [false, true] {
        let out = run_local(3, move |g| {
            let mut v = vec![g.rank() as f32; 4];
            let root = if agree { 0 } else { g.rank() };
            let call = g.typed::<f32>().broadcast(&mut v, root);
            (call.is_err(), g.clone().finalize())
        });
        let failed = out.iter().filter(|(call, end)| *call || end.is_err()).count();
        if agree {
            assert_eq!(failed, 0, "{out:?}");
            continue;
        }
        assert!(failed > 0, "nothing found: {out:?}");
        for (_, end) in &out {
            if let Err(e) = end {
                assert!(matches!(e.kind(), ErrorKind::Mismatch { .. }), "{e}");
                assert!(e.to_string().contains("broadcast") && e.context().peer.is_some(), "{e}");
            }
        }
    }
}

#[test]
fn varying_counts_that_do_not_fit_are_errors_before_anything_moves() {
    let out = run_local(2, |g| {
        let c = g.typed::<u32>();
        let (r, counts) = (g.rank(), ccl::Counts::new(&[2, 3]).expect("counts"));
        let mut all = vec![0u32; 5];
        let short_send = c.all_gatherv(&[1u32], &mut all, &counts).expect_err("send of 1, count 2 or 3");
        let short_recv = c.all_gatherv(&vec![1u32; 2 + r], &mut all[..4], &counts).expect_err("4 of 5");
        let three = ccl::Counts::new(&[1, 1, 1]).expect("counts");
        let ranks = c.gatherv(&[1u32], &mut all, &three, 0).expect_err("3 ranks' counts on 2");
        // the communicator goes on: nothing of the refused calls moved
        let mine = vec![r as u32; 2 + r];
        c.all_gatherv(&mine, &mut all, &counts).expect("fits");
        (short_send, short_recv, ranks, all)
    });
    for (rank, r) in out.into_iter().enumerate() {
        let (send, recv, ranks, all) = r;
        assert!(matches!(send.kind(), ErrorKind::BufferSize { what: "send buffer", got: 1, .. }), "{send}");
        assert!(send.to_string().contains(&format!("rank {rank}, all_gatherv")), "{send}");
        assert!(matches!(recv.kind(), ErrorKind::BufferSize { what: "recv buffer", expected: 5, got: 4 }), "{recv}");
        assert!(ranks.to_string().contains("counts name 3 ranks, on a communicator of 2"), "{ranks}");
        assert_eq!(all, [0, 0, 1, 1, 1]);
    }
}
