//! Ranks that fail on purpose, for the fault tests.
//!
//! `fault exit R C`: after one all-reduce, rank R exits with code C; the
//! others try another and report what they get. `fault kill R`: all-reduce
//! in a loop; rank R SIGKILLs itself on the 5th iteration (`fault stop R`:
//! SIGSTOPs itself, so only deadlines can end the job). `fault hang`:
//! print the pid, then sleep (for signal tests). `fault mismatch R`: rank R
//! calls broadcast while the others call all_reduce. `fault stuck`: rank 0
//! prints its pid and waits in an all-reduce rank 1 joins 30 s later.
//! `fault loop S`: all-reduce in a loop for S seconds (rank 0 prints
//! `looping` once every rank has done one), for faults from outside.
//! `fault check N [split]`: all_reduce N elements, in place and on an
//! `alloc_shared` buffer, and check them (prints `checked`); with `split`,
//! then idle a second, split in two and all_reduce in each half.
//! `fault roots broadcast|reduce N [last]`: every rank its own root, then
//! an all_reduce (none with `last`).
//! `fault bcast N`: a broadcast of N elements from rank 0, checked
//! (prints `checked`), and the end at once.
//! `fault alloc-hang N`: rank 0 waits inside `alloc_shared(N)` for ranks
//! that never come.
//! `fault gpu-exit R`: on emulated GPUs, every rank queues an all-reduce
//! of device buffers; rank R's GPU is slow, and R exits (code 3) soon
//! after its call returns, before its GPU has run its part; the others then
//! synchronise their streams, which wait on R's flags.

use ccl::Sum;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).and_then(|s| s.parse::<usize>().ok()).unwrap_or(0);
    let g = ccl::init().unwrap_or_else(|e| {
        eprintln!("init: {e}");
        std::process::exit(2)
    });
    let comm = g.typed::<f32>();
    let mut buf = vec![1.0f32; 1 << 18];
    let report = |e: ccl::Error| -> ! {
        eprintln!("rank {} error: {e}", g.rank());
        std::process::exit(1)
    };
    match args.first().map(String::as_str) {
        Some("exit") => {
            comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            if g.rank() == arg(1) {
                std::process::exit(arg(2) as i32);
            }
            comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
        }
        Some(mode @ ("kill" | "stop")) => {
            let sig = if mode == "kill" { libc::SIGKILL } else { libc::SIGSTOP };
            for it in 0..10_000 {
                if it == 5 && g.rank() == arg(1) {
                    // SAFETY: signalling our own process.
                    unsafe { libc::kill(libc::getpid(), sig) };
                }
                comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            }
        }
        Some("mismatch") => {
            // rank R calls broadcast where everyone else calls all_reduce
            if g.rank() == arg(1) {
                comm.broadcast(&mut buf, 0).unwrap_or_else(|e| report(e));
            } else {
                comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            }
        }
        Some("stuck") => {
            // rank 0 waits in an all-reduce that rank 1 joins only after 30 s
            if g.rank() == 0 {
                println!("pid {}", std::process::id());
            } else {
                std::thread::sleep(std::time::Duration::from_secs(30));
            }
            comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
        }
        Some("loop") => {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(arg(1) as u64);
            comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            if g.rank() == 0 {
                println!("looping");
            }
            while std::time::Instant::now() < end {
                comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            }
        }
        Some("check") => {
            // all_reduce of N elements, in place and then on an
            // alloc_shared buffer, checked against the sum (exact: small
            // integers); prints `checked` on success
            let n = arg(1);
            let size = g.size() as f32;
            let want = |i: usize| (i % 7) as f32 * size * (size + 1.0) / 2.0;
            let mut v: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * (g.rank() + 1) as f32).collect();
            comm.all_reduce(&mut v, Sum).unwrap_or_else(|e| report(e));
            let mut s = comm.alloc_shared(n).unwrap_or_else(|e| report(e));
            s.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 7) as f32 * (g.rank() + 1) as f32);
            comm.all_reduce(&mut s, Sum).unwrap_or_else(|e| report(e));
            if let Some(i) = (0..n).find(|&i| v[i] != want(i) || s[i] != want(i)) {
                eprintln!("rank {} error: element {i}: {} and {} where {} was due", g.rank(), v[i], s[i], want(i));
                std::process::exit(1)
            }
            if args.get(2).map(String::as_str) == Some("split") {
                // idle a while (listeners meet strangers), then new connections
                std::thread::sleep(std::time::Duration::from_secs(1));
                let color = Some((g.rank() % 2) as u32);
                let half = g.split(color, g.rank() as i64).unwrap_or_else(|e| report(e));
                let Some(half) = half else { return };
                let mut h = vec![1.0f32; n];
                half.typed::<f32>().all_reduce(&mut h, Sum).unwrap_or_else(|e| report(e));
                if h.iter().any(|&x| x != half.size() as f32) {
                    eprintln!("rank {} error: the split's all_reduce came out wrong", g.rank());
                    std::process::exit(1)
                }
            }
            println!("checked");
        }
        Some("roots") => {
            // every rank calls a broadcast or reduce of N elements with
            // itself as the root, then an all_reduce
            let mut v = vec![g.rank() as f32; arg(2)];
            let first = match args.get(1).map(String::as_str) {
                Some("reduce") => comm.reduce(&mut v, Sum, g.rank()),
                _ => comm.broadcast(&mut v, g.rank()),
            };
            first.unwrap_or_else(|e| report(e));
            if args.get(3).map(String::as_str) != Some("last") {
                comm.all_reduce(&mut buf, Sum).unwrap_or_else(|e| report(e));
            }
            println!("no error");
        }
        Some("bcast") => {
            // a broadcast of N elements from rank 0, checked, and the end
            // at once: the root may be gone before the others are done
            let mut v: Vec<f32> = (0..arg(1)).map(|i| if g.rank() == 0 { (i % 7) as f32 } else { -1.0 }).collect();
            comm.broadcast(&mut v, 0).unwrap_or_else(|e| report(e));
            if let Some(i) = (0..v.len()).find(|&i| v[i] != (i % 7) as f32) {
                eprintln!("rank {} error: element {i}: {} where {} was due", g.rank(), v[i], i % 7);
                std::process::exit(1)
            }
            println!("checked");
        }
        Some("alloc-hang") => {
            // rank 0 waits inside alloc_shared of N floats (its file made)
            // for rank 1, which comes only after 600 s
            if g.rank() != 0 {
                std::thread::sleep(std::time::Duration::from_secs(600));
            }
            println!("allocating");
            let _ = comm.alloc_shared(arg(1)).unwrap_or_else(|e| report(e));
        }
        Some("gpu-exit") => {
            use ccl::gpu::{Emulation, Gpu};
            let gpu = Gpu::emulated(g.rank());
            // the emulator's own bound on a wait far off: the host's watch must act first
            let wait_limit = std::time::Duration::from_secs(600);
            let delay = std::time::Duration::from_millis(if g.rank() == arg(1) { 500 } else { 0 });
            gpu.emulate(Emulation { delay, wait_limit, ..Emulation::default() }).unwrap_or_else(|e| report(e));
            let s = gpu.stream().unwrap_or_else(|e| report(e));
            let mut d = gpu.upload(&buf, &s).unwrap_or_else(|e| report(e));
            comm.all_reduce(&mut d, Sum).unwrap_or_else(|e| report(e));
            if g.rank() == arg(1) {
                // long enough for the peers to map its slots (else they fail
                // there, first), far shorter than its GPU's part
                std::thread::sleep(std::time::Duration::from_millis(100));
                std::process::exit(3);
            }
            s.synchronize().unwrap_or_else(|e| report(e));
            println!("rank {}: no error", g.rank());
        }
        Some("hang") => {
            println!("pid {}", std::process::id());
            std::thread::sleep(std::time::Duration::from_secs(600));
        }
        _ => eprintln!(
            "usage: fault exit R C | kill R | stop R | mismatch R | stuck | loop S | check N [split] | roots broadcast|reduce N [last] | bcast N | alloc-hang N | gpu-exit R | hang"
        ),
    }
}
