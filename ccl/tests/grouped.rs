//! Grouped point-to-point: halo exchanges in any posting order, messages
//! larger than a connection holds, a receive nobody sends, bad peers.
//! Ranks as threads.

mod common;

use ccl::config::CheckMode;
use ccl::testing::LocalJob;
use ccl::{Config, ErrorKind, Sum};
use common::{compare, input, seed};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::time::{Duration, Instant};

/// Slots of 16 KiB: the halos below are 16 times what a connection holds.
fn config(timeout: Duration) -> Config {
    Config { timeout, buffsize: Some(16384), ..Config::default() }
}

#[test]
fn halos_posted_in_any_order_complete_with_every_neighbours_data() {
    let seed = seed();
    for n in 2..=5usize {
        let out = LocalJob::new(n).config(config(Duration::from_secs(60))).run(|g| -> Result<(), String> {
            let (r, c) = (g.rank(), g.typed::<f32>());
            let len = 64 << 10;
            // to and from both neighbours on a ring (one on 2 ranks), and
            // each rank's sends and receives in its own random order
            let (left, right) = ((r + n - 1) % n, (r + 1) % n);
            let to_left: Vec<f32> = input(seed, 1, r, len, false);
            let to_right: Vec<f32> = input(seed, 2, r, len, false);
            let (mut from_left, mut from_right) = (vec![0.0f32; len], vec![0.0f32; len]);
            let mut order = [0, 1, 2, 3];
            order.shuffle(&mut StdRng::seed_from_u64(seed ^ r as u64));
            c.grouped(|grp| {
                let mut bufs = (Some(&mut from_left), Some(&mut from_right));
                for k in order {
                    match k {
                        0 => grp.send(&to_left, left)?,
                        1 => grp.send(&to_right, right)?,
                        2 => grp.recv(bufs.0.take().expect("once"), left)?,
                        _ => grp.recv(bufs.1.take().expect("once"), right)?,
                    }
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
            // on 2 ranks both neighbours are one: its two messages, in the order it posted them
            let want_left: Vec<f32> = input(seed, 2, left, len, false);
            let want_right: Vec<f32> = input(seed, 1, right, len, false);
            if n > 2 {
                compare("from the left", &from_left, &want_left, 1)?;
                compare("from the right", &from_right, &want_right, 1)?;
            }
            // sendrecv: to the right, from the left, then the other way
            let mut got = vec![0.0f32; len];
            c.sendrecv(&to_right, right, &mut got, left).map_err(|e| e.to_string())?;
            compare("sendrecv", &got, &input::<f32>(seed, 2, left, len, false), 1)?;
            // the communicator goes on as before
            let mut v = vec![1.0f32; 4];
            c.all_reduce(&mut v, Sum).map_err(|e| e.to_string())?;
            compare("all_reduce after", &v, &[n as f32; 4], 1)
        });
        for (rank, r) in out.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("{n} ranks, rank {rank}: {e} (seed {seed})"));
        }
    }
}

#[test]
fn a_receive_nobody_sends_ends_the_group_by_the_deadline_naming_the_peer() {
    let out = LocalJob::new(3).config(config(Duration::from_millis(300))).run(|g| {
        let c = g.typed::<u8>();
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let t = Instant::now();
        let r = match g.rank() {
            // waits on rank 1, which sends nothing, while sending to rank 2
            0 => c.grouped(|grp| {
                grp.recv(&mut a, 1)?;
                grp.send(&[7u8; 8], 2)
            }),
            1 => Ok(()),
            _ => c.grouped(|grp| grp.recv(&mut b, 0)),
        };
        (r, b, t.elapsed())
    });
    let (r0, _, took) = &out[0];
    let e = r0.as_ref().expect_err("rank 1 sends nothing");
    assert!(matches!(e.kind(), ErrorKind::Timeout { .. }), "{e}");
    let s = e.to_string();
    assert!(s.starts_with("rank 0, recv #0") && s.contains("from rank 1"), "{s}");
    assert!(*took < Duration::from_secs(10), "{took:?}");
    // the send that did not depend on it went through
    let (r2, b, _) = &out[2];
    assert!(r2.is_ok(), "{r2:?}");
    assert_eq!(*b, [7u8; 8]);
}

#[test]
fn a_bad_peer_is_an_error_before_anything_moves() {
    let out = LocalJob::new(2).config(config(Duration::from_secs(30))).run(|g| {
        let c = g.typed::<i32>();
        let mut got = [0i32; 3];
        let other = 1 - g.rank();
        let to_self = c.grouped(|grp| {
            grp.send(&[1, 2, 3], other)?;
            grp.recv(&mut got, g.rank())
        });
        let beyond = c.sendrecv(&[1], 2, &mut [0], other);
        // nothing of the failed groups was sent: this exchange reads what it should
        let mut got = [0i32; 3];
        c.sendrecv(&[g.rank() as i32; 3], other, &mut got, other).expect("still usable");
        (to_self.expect_err("self"), beyond.expect_err("rank 2 of 2"), got)
    });
    for (rank, (to_self, beyond, got)) in out.into_iter().enumerate() {
        assert!(matches!(to_self.kind(), ErrorKind::InvalidArgument(_)), "{to_self}");
        assert!(matches!(beyond.kind(), ErrorKind::RankOutOfRange { rank: 2, size: 2, .. }), "{beyond}");
        assert_eq!(got, [(1 - rank) as i32; 3]);
    }
}

#[test]
fn collectives_in_a_group_run_beside_its_sends_and_receives() {
    let seed = seed();
    // checked calls too: each collective first exchanges its call, while the group's others wait
    for (n, check) in [(2, CheckMode::Default), (3, CheckMode::Full), (4, CheckMode::Default)] {
        let config = Config { check, ..config(Duration::from_secs(60)) };
        let out = LocalJob::new(n).config(config).run(|g| -> Result<(), String> {
            let (r, c) = (g.rank(), g.typed::<f64>());
            let len = 40 << 10;
            let (left, right) = ((r + n - 1) % n, (r + 1) % n);
            let edge: Vec<f64> = input(seed, 1, r, len, true);
            let mut halo = vec![0.0f64; len];
            let grads: Vec<Vec<f64>> = (0..n).map(|k| input(seed, 2, k, len, true)).collect();
            let parts: Vec<Vec<f64>> = (0..n).map(|k| input(seed, 3, k, 3, false)).collect();
            let mut grad = grads[r].clone();
            let mut params = if r == 0 { input(seed, 4, 0, 5, false) } else { vec![0.0; 5] };
            let mut all = vec![0.0f64; 3 * n];
            let mut mine = vec![0.0f64; len / n];
            // the collectives in one order on every rank, the halo's two
            // halves on either side of them or not, by rank
            let mut halo_buf = Some(&mut halo);
            c.grouped(|grp| {
                if r % 2 == 0 {
                    grp.recv(halo_buf.take().expect("once"), left)?;
                }
                grp.all_reduce(&mut grad, Sum)?;
                grp.send(&edge, right)?;
                grp.broadcast(&mut params, 0)?;
                grp.all_gather(&parts[r], &mut all)?;
                grp.reduce_scatter(&grads[r][..len / n * n], &mut mine, Sum)?;
                if let Some(h) = halo_buf.take() {
                    grp.recv(h, left)?;
                }
                Ok(())
            })
            .map_err(|e| e.to_string())?;
            let sum: Vec<f64> = (0..len).map(|i| grads.iter().map(|v| v[i]).sum()).collect();
            compare("halo", &halo, &input::<f64>(seed, 1, left, len, true), 1)?;
            compare("all_reduce", &grad, &sum, n)?;
            compare("broadcast", &params, &input::<f64>(seed, 4, 0, 5, false), 1)?;
            compare("all_gather", &all, &parts.concat(), 1)?;
            compare("reduce_scatter", &mine, &sum[r * (len / n)..(r + 1) * (len / n)], n)
        });
        for (rank, r) in out.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("{n} ranks, rank {rank}: {e} (seed {seed})"));
        }
    }
}
