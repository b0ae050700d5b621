//! Device buffers in the collectives, on an emulated GPU (this machine has
//! none): every blocking collective × types × ring, tree and recursive
//! doubling × 1..4 ranks sharing one GPU, against the host reference; and
//! the bad input a GPU path gets. Each emulated stream is a thread of its
//! own, so a call returns before its work has run, and a missing wait
//! shows as wrong data (both shown below). The same matrix runs on a real GPU in integration/gpu/check.sh.

mod common;

use ccl::algo::Algo;
use ccl::gpu::{DeviceBuffer, Emulation, Gpu};
use ccl::testing::{run_local, LocalJob};
use ccl::{Config, ErrorKind, Sum};
use common::gpu_matrix::{everything_on, graphs_on};
use common::seed;
use std::time::Duration;

/// Small device slots (4 KiB), so that calls span several and come back
/// to a slot before its reader is done with it.
fn matrix(algo: Option<Algo>, nchannels: usize) {
    matrix_on(algo, nchannels, |n| vec![n]);
}

/// [`matrix`] with the ranks on hosts of `sizes(ranks)` ranks each.
fn matrix_on(algo: Option<Algo>, nchannels: usize, sizes: fn(usize) -> Vec<usize>) {
    matrix_with(Config { algo, nchannels: Some(nchannels), ..Config::default() }, sizes);
}

/// [`matrix`] with every device call finished by the proxy thread.
fn matrix_proxied(algo: Option<Algo>, nchannels: usize) {
    matrix_with(Config { algo, nchannels: Some(nchannels), gpu_proxy: true, ..Config::default() }, |n| vec![n]);
}

fn matrix_with(config: Config, sizes: fn(usize) -> Vec<usize>) {
    let (seed, algo) = (seed(), config.algo);
    for n in [1, 2, 3, 4] {
        let timeout = Duration::from_secs(120);
        let config = Config { buffsize: Some(16384), gpu_slot: Some(4096), timeout, ..config.clone() };
        let job = LocalJob::new(n).hosts(&sizes(n)).config(config);
        for (rank, r) in job.run(|g| everything_on(&g, &Gpu::emulated(0), seed)).into_iter().enumerate() {
            if let Err(e) = r {
                panic!("algo {algo:?}, {n} ranks on hosts {:?}, rank {rank}: {e} (seed {seed})", sizes(n));
            }
        }
    }
}

#[test]
fn ring_on_device_buffers() {
    matrix(Some(Algo::Ring), 1);
}

#[test]
fn two_channels_on_streams_of_their_own() {
    matrix(Some(Algo::Ring), 2);
}

#[test]
fn calls_finished_by_the_proxy_thread() {
    matrix_proxied(Some(Algo::Ring), 2);
    matrix_proxied(Some(Algo::Tree), 1);
}

#[test]
fn halving_doubling_on_device_buffers() {
    matrix(Some(Algo::HalvingDoubling), 1);
}

/// Two "hosts" of the in-process transport: the hierarchical algorithms'
/// inner and outer steps, with device calls cut by the host slots.
fn two_hosts(n: usize) -> Vec<usize> {
    if n == 1 {
        vec![1]
    } else {
        vec![n / 2, n - n / 2]
    }
}

#[test]
fn ring_ring_and_tree_ring_on_device_buffers_across_two_hosts() {
    matrix_on(Some(Algo::RingRing), 1, two_hosts);
    matrix_on(Some(Algo::TreeRing), 1, two_hosts);
}

#[test]
fn tree_on_device_buffers() {
    matrix(Some(Algo::Tree), 1);
}

#[test]
fn gather_and_scatter_straight_to_the_root_on_device_buffers() {
    matrix(Some(Algo::Direct), 2);
}

#[test]
fn recursive_doubling_on_device_buffers() {
    matrix(Some(Algo::RecursiveDoubling), 1);
}

#[test]
fn tuner_choice_on_device_buffers_with_a_gpu_per_rank() {
    let seed = seed();
    let job = LocalJob::new(3).config(Config { buffsize: Some(16384), ..Config::default() });
    // ranks on GPUs 10, 11, 12 of this process: peers' slots are used in place
    for r in job.run(|g| everything_on(&g, &Gpu::emulated(10 + g.rank()), seed)) {
        r.unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    }
}

#[test]
fn host_and_device_buffers_in_one_call_are_an_error() {
    let out = run_local(1, |g| -> ccl::Result<()> {
        let gpu = Gpu::emulated(0);
        let s = gpu.stream()?;
        let mut dev = gpu.alloc::<f32>(4, &s)?;
        let comm = g.typed::<f32>();
        let e = comm.all_reduce_into(&[1.0f32; 4][..], &mut dev, Sum).expect_err("must fail");
        assert!(matches!(e.kind(), ErrorKind::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("input buffer is host memory but the output buffer is device memory"), "{e}");
        assert!(e.to_string().starts_with("rank 0, all_reduce #0"), "{e}");
        let mut host = [0.0f32; 4];
        let e = comm.all_reduce_into(&dev, &mut host, Sum).expect_err("must fail");
        assert!(e.to_string().contains("input buffer is device memory but the output buffer is host memory"), "{e}");
        Ok(())
    });
    out.into_iter().for_each(|r| r.expect("must succeed"));
}

#[test]
fn a_host_pointer_posing_as_device_memory_is_an_error() {
    run_local(1, |g| {
        let gpu = Gpu::emulated(0);
        let s = gpu.stream().expect("must succeed");
        let mut host = vec![1.0f32; 8];
        // SAFETY: the pointer is valid for 8 elements while `host` lives;
        // ccl must refuse it as device memory rather than use it.
        let mut fake = unsafe { DeviceBuffer::<f32>::from_raw(host.as_mut_ptr() as u64, 8, &s) };
        let e = g.typed::<f32>().all_reduce(&mut fake, Sum).expect_err("must fail");
        assert!(e.to_string().contains("GPU: the buffer is host memory, not device memory of emulated GPU 0"), "{e}");
    });
}

#[test]
fn buffers_on_another_gpu_than_the_first_call_are_an_error() {
    run_local(2, |g| {
        let comm = g.typed::<f32>();
        let gpu0 = Gpu::emulated(20 + g.rank());
        let s0 = gpu0.stream().expect("must succeed");
        let mut a = gpu0.upload(&[1.0f32, 2.0], &s0).expect("must succeed");
        comm.all_reduce(&mut a, Sum).expect("must succeed");
        assert_eq!(a.to_vec().expect("must succeed"), [2.0, 4.0]);
        let gpu1 = Gpu::emulated(30 + g.rank());
        let s1 = gpu1.stream().expect("must succeed");
        let mut b = gpu1.upload(&[1.0f32, 2.0], &s1).expect("must succeed");
        let e = comm.all_reduce(&mut b, Sum).expect_err("must fail");
        assert!(e.to_string().contains(&format!("this communicator runs on emulated GPU {}", 20 + g.rank())), "{e}");
        // input and output on different GPUs
        let mut out = gpu0.alloc::<f32>(2, &s0).expect("must succeed");
        let e = comm.all_reduce_into(&b, &mut out, Sum).expect_err("must fail");
        let want = format!(
            "the input buffer is on emulated GPU {} but the output buffer is on emulated GPU {}",
            30 + g.rank(),
            20 + g.rank()
        );
        assert!(e.to_string().contains(&want), "{e}");
    });
}

#[test]
fn a_stream_of_another_context_is_an_error() {
    let gpu0 = Gpu::emulated(40);
    let gpu1 = Gpu::emulated(41);
    let other = gpu1.stream().expect("must succeed");
    // SAFETY: the raw stream outlives `wrong`; ccl must refuse it.
    let wrong = unsafe { gpu0.wrap_stream(other.raw()) };
    let e = gpu0.alloc::<f32>(4, &wrong).expect_err("must fail");
    assert!(e.to_string().contains("is not a stream of emulated GPU 40"), "{e}");
    let s0 = gpu0.stream().expect("must succeed");
    let mut b = gpu0.alloc::<f32>(4, &s0).expect("must succeed");
    assert!(b.set_stream(&wrong).is_err());
    assert!(b.set_stream(&gpu0.stream().expect("must succeed")).is_ok());
}

#[derive(Clone, Copy, Debug, Default)]
struct Odd;
impl ccl::Op for Odd {
    const NAME: &'static str = "odd";
}
impl ccl::ReduceOp<f32> for Odd {
    fn combine(a: f32, b: f32) -> f32 {
        a.max(b)
    }
}

#[test]
fn a_user_operator_on_device_buffers_is_an_error_and_on_host_works() {
    run_local(2, |g| {
        let comm = g.typed::<f32>();
        let gpu = Gpu::emulated(50 + g.rank());
        let s = gpu.stream().expect("must succeed");
        let mut d = gpu.upload(&[g.rank() as f32], &s).expect("must succeed");
        let e = comm.all_reduce(&mut d, Odd).expect_err("must fail");
        assert!(e.to_string().contains("operator odd has no GPU kernel for f32"), "{e}");
        let mut h = [g.rank() as f32];
        comm.all_reduce(&mut h, Odd).expect("must succeed");
        assert_eq!(h, [1.0]);
    });
}

#[test]
fn a_device_call_meeting_a_host_call_fails_on_both_sides() {
    let config = Config { timeout: Duration::from_secs(20), ..Config::default() };
    let out = LocalJob::new(2).config(config).run(|g| {
        let comm = g.typed::<f32>();
        if g.rank() == 0 {
            let gpu = Gpu::emulated(60);
            let s = gpu.stream().expect("must succeed");
            let mut d = gpu.upload(&[1.0f32; 64], &s).expect("must succeed");
            comm.all_reduce(&mut d, Sum).expect_err("must fail")
        } else {
            comm.all_reduce(&mut [1.0f32; 64], Sum).expect_err("must fail")
        }
    });
    for e in out {
        let m = e.to_string();
        assert!(matches!(e.kind(), ErrorKind::Mismatch { .. } | ErrorKind::PeerLost { .. }), "{m}");
        assert!(m.contains("all_reduce #0"), "{m}");
    }
}

/// Two ranks as threads, rank 0 on emulated GPU `slow` (every copy and
/// kernel takes `delay`), rank 1 on GPU `fast` with `fast_how`: each
/// all-reduces fresh random data by the ring, and returns whether its
/// result is the sum.
fn slow_and_fast(slow: usize, fast: usize, delay: Duration, fast_how: Emulation) -> Vec<bool> {
    Gpu::emulated(slow).emulate(Emulation { delay, ..Emulation::default() }).expect("must succeed");
    Gpu::emulated(fast).emulate(fast_how).expect("must succeed");
    let count = 8192;
    let ins: Vec<Vec<f32>> = (0..2).map(|_| (0..count).map(|_| rand::random::<f32>()).collect()).collect();
    let want: Vec<f32> = (0..count).map(|i| ins[0][i] + ins[1][i]).collect();
    let config = Config { algo: Some(Algo::Ring), buffsize: Some(16384), gpu_slot: Some(4096), ..Config::default() };
    LocalJob::new(2).config(config).run(|g| {
        let gpu = Gpu::emulated(if g.rank() == 0 { slow } else { fast });
        let s = gpu.stream().expect("must succeed");
        let mut d = gpu.upload(&ins[g.rank()], &s).expect("must succeed");
        g.typed::<f32>().all_reduce(&mut d, Sum).expect("must succeed");
        let got = d.to_vec().expect("must succeed");
        got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1.0))
    })
}

#[test]
fn a_device_call_returns_before_the_gpu_has_run_it() {
    // rank 0's GPU starts nothing until the call has returned: a call that
    // waited for it would never return (its peer would time out)
    let (n, seed) = (8192, seed());
    let ins: Vec<Vec<f32>> =
        (0..2).map(|r| (0..n).map(|i| ((seed as usize + r * 7 + i) % 13) as f32).collect()).collect();
    let config =
        Config { algo: Some(Algo::Ring), gpu_slot: Some(4096), timeout: Duration::from_secs(20), ..Config::default() };
    let out = LocalJob::new(2).config(config).run(|g| {
        let gpu = Gpu::emulated(40 + g.rank());
        let s = gpu.stream().expect("must succeed");
        let mut d = gpu.upload(&ins[g.rank()], &s).expect("must succeed");
        let pause = |paused| gpu.emulate(Emulation { paused, ..Emulation::default() }).expect("must succeed");
        if g.rank() == 0 {
            pause(true);
        }
        let call = g.typed::<f32>().all_reduce(&mut d, Sum);
        let busy = !s.query().expect("must succeed");
        if g.rank() == 0 {
            pause(false);
        }
        (call, busy, d.to_vec())
    });
    assert!(out[0].0.is_ok() && out[0].1, "rank 0's call returned while its GPU had run nothing: {:?}", out[0].0);
    for (call, _, got) in out {
        let got = got.expect("must succeed");
        assert!(call.is_ok() && got.iter().zip(&ins[0]).zip(&ins[1]).all(|((g, a), b)| *g == a + b), "{call:?}");
    }
}

#[test]
fn a_missing_wait_on_a_flag_shows_as_wrong_data() {
    // rank 1's first wait (for rank 0's first message) dropped: it reduces
    // the slot before the slow GPU has filled it
    let drop = Emulation { drop_wait: Some(1), ..Emulation::default() };
    let out = slow_and_fast(42, 43, Duration::from_millis(50), drop);
    assert!(out.iter().any(|&right| !right), "no rank saw the missing wait: {out:?}");
}

#[test]
fn collectives_captured_into_a_graph_replay_right() {
    let seed = seed();
    for (n, nchannels) in [(1, 1), (2, 1), (3, 1), (3, 2)] {
        let config = Config {
            gpu_slot: Some(4096),
            nchannels: Some(nchannels),
            timeout: Duration::from_secs(60),
            ..Config::default()
        };
        let out = LocalJob::new(n).config(config).run(|g| graphs_on(&g, &Gpu::emulated(0), seed));
        for (rank, r) in out.into_iter().enumerate() {
            if let Err(e) = r {
                panic!("{n} ranks, {nchannels} channels, rank {rank}: {e} (seed {seed})");
            }
        }
    }
}

#[test]
fn work_left_queued_by_a_failed_call_is_released_not_left_waiting() {
    // both ranks' calls fail queueing (a driver error), rank 1's early and
    // rank 0's late: rank 0 has queued waits for messages of rank 1 that
    // rank 1 never queued, and its stream would wait for ever
    let how =
        |at: u64| Emulation { fail_queue: Some(at), wait_limit: Duration::from_secs(600), ..Emulation::default() };
    Gpu::emulated(54).emulate(how(FAIL_LATE)).expect("must succeed");
    Gpu::emulated(55).emulate(how(FAIL_EARLY)).expect("must succeed");
    let config =
        Config { algo: Some(Algo::Ring), gpu_slot: Some(4096), timeout: Duration::from_secs(3), ..Config::default() };
    let out = LocalJob::new(2).config(config).run(|g| {
        let gpu = Gpu::emulated(54 + g.rank());
        let s = gpu.stream().expect("must succeed");
        let mut d = gpu.upload(&vec![1.0f32; 8192], &s).expect("must succeed");
        let call = g.typed::<f32>().all_reduce(&mut d, Sum);
        (call, s.synchronize())
    });
    for (rank, (call, _)) in out.iter().enumerate() {
        assert!(call.as_ref().is_err_and(|e| e.to_string().contains("emulated driver error")), "{rank}: {call:?}");
    }
    let e = out[0].1.as_ref().expect_err("rank 0's queued waits were released");
    assert!(e.to_string().contains("the call failed on the host after queueing part of its device work"), "{e}");
}

/// Copies and kernels (uploads included) after which the ranks above fail.
const FAIL_LATE: u64 = 14;
const FAIL_EARLY: u64 = 6;

#[test]
fn ranks_of_one_process_on_gpus_without_peer_access_fail_with_a_clear_error() {
    Gpu::emulated(53).emulate(Emulation { no_peer: true, ..Emulation::default() }).expect("must succeed");
    let config = Config { algo: Some(Algo::Ring), timeout: Duration::from_secs(3), ..Config::default() };
    let out = LocalJob::new(2).config(config).run(|g| {
        let gpu = Gpu::emulated(52 + g.rank());
        let s = gpu.stream().expect("must succeed");
        let mut d = gpu.upload(&[1.0f32; 1024], &s).expect("must succeed");
        g.typed::<f32>().all_reduce(&mut d, Sum).and_then(|()| s.synchronize())
    });
    let e = out[1].as_ref().expect_err("GPU 53 cannot read GPU 52's slots");
    assert!(e.to_string().contains("cannot reach the memory of emulated GPU 52 (no peer access"), "{e}");
    assert!(e.to_string().contains("all_reduce #0") && e.to_string().contains("rank 1"), "{e}");
    assert!(out[0].is_err(), "rank 0 learns its peer failed: {:?}", out[0]);
}

#[cfg(not(feature = "cuda"))]
#[test]
fn opening_a_gpu_without_the_feature_is_an_error() {
    let e = Gpu::open(0).expect_err("must fail");
    assert!(e.to_string().contains("built without feature `cuda`"), "{e}");
}

/// With the feature and no driver (this machine), an error and no panic.
#[cfg(feature = "cuda")]
#[test]
fn opening_a_gpu_without_a_driver_is_an_error() {
    if ccl_kernels_driver() {
        eprintln!("SKIPPED: a CUDA driver is installed here");
        return;
    }
    let e = Gpu::open(0).expect_err("must fail");
    assert!(e.to_string().contains("no CUDA driver"), "{e}");
    assert!(Gpu::for_local_rank(3).is_err());
}

#[cfg(feature = "cuda")]
fn ccl_kernels_driver() -> bool {
    ["libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"].iter().any(|p| std::path::Path::new(p).exists())
}
