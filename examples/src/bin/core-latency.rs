//! `core-latency`: how long one cache line takes to go from one CPU to
//! another and back, in nanoseconds (the median of `--samples` timings of
//! `--rounds` round trips each), printed alone on one line.
//!
//! ```text
//! core-latency            # CPUs 0 and 1
//! core-latency --cpus 2,5 --rounds 20000
//! ```
//!
//! The bench scripts run it around every measured run: on a VM whose two
//! vCPUs the host places sometimes near each other and sometimes far
//! apart (on the project's 2-core machine about 80 against 330 ns), small
//! collectives run 3-4x slower in the far placement, and the round trip
//! tells which placement a run had.
//!
//! Both threads poll without a pause instruction (`spin_loop`): a pause
//! takes long enough on some hosts to hide the difference between the
//! placements.

use clap::Parser;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(name = "core-latency", about = "Round trip of a cache line between two CPUs, in ns")]
struct Args {
    /// The two CPUs, as FIRST,SECOND
    #[arg(long, default_value = "0,1")]
    cpus: String,
    /// Round trips per sample
    #[arg(long, default_value_t = 10_000)]
    rounds: u64,
    /// Samples; the median is printed
    #[arg(long, default_value_t = 9)]
    samples: usize,
}

/// The line the two threads bounce, alone in its cache line.
#[repr(align(128))]
struct Line(AtomicU64);

/// How long a wait for the other thread may last before the probe gives
/// up: far more than any round trip, so only a thread that cannot run
/// reaches it.
const PATIENCE: Duration = Duration::from_secs(2);

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu} is beyond the {} a CPU set holds", libc::CPU_SETSIZE));
    }
    // SAFETY: a zeroed cpu_set_t is an empty set, and CPU_SET writes a bit
    // inside it (cpu < CPU_SETSIZE, checked above).
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    };
    // SAFETY: the set is a valid cpu_set_t of the size passed; pid 0 is
    // the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(format!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Waits until `line` holds `want`, polling without a pause; false if the
/// other thread did not answer within `PATIENCE`.
fn wait_for(line: &Line, want: u64) -> bool {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while line.0.load(Ordering::Acquire) != want {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1 << 20) && since.get_or_insert_with(Instant::now).elapsed() > PATIENCE {
            return false;
        }
    }
    true
}

fn parse_cpus(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--cpus wants two different CPUs as FIRST,SECOND, got {s:?}");
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    let a: usize = a.trim().parse().map_err(|_| bad())?;
    let b: usize = b.trim().parse().map_err(|_| bad())?;
    if a == b {
        return Err(bad());
    }
    Ok((a, b))
}

fn run(args: &Args) -> Result<f64, String> {
    let (first, second) = parse_cpus(&args.cpus)?;
    if args.rounds == 0 || args.samples == 0 {
        return Err("--rounds and --samples must be at least 1".into());
    }
    // both threads are pinned before the first round trip: a CPU that
    // cannot be had is an error of its own, not a wait for an answer
    pin(first)?;
    let total = args.rounds * args.samples as u64;
    let line = Arc::new(Line(AtomicU64::new(0)));
    let peer = Arc::clone(&line);
    let (pinned_tx, pinned_rx) = std::sync::mpsc::channel();
    // The echo: answers every odd turn with the next even one.
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let pinned = pin(second);
        let _ = pinned_tx.send(pinned.clone());
        pinned?;
        for i in 0..total {
            if !wait_for(&peer, 2 * i + 1) {
                return Err(format!("CPU {second} got no answer from CPU {first}"));
            }
            peer.0.store(2 * i + 2, Ordering::Release);
        }
        Ok(())
    });
    if let Err(e) = pinned_rx.recv().unwrap_or_else(|_| Err("the echo thread ended".into())) {
        let _ = echo.join();
        return Err(e);
    }
    let mut samples = Vec::with_capacity(args.samples);
    for s in 0..args.samples as u64 {
        let start = Instant::now();
        for i in s * args.rounds..(s + 1) * args.rounds {
            line.0.store(2 * i + 1, Ordering::Release);
            if !wait_for(&line, 2 * i + 2) {
                return Err(format!("CPU {first} got no answer from CPU {second}"));
            }
        }
        samples.push(start.elapsed().as_nanos() as f64 / args.rounds as f64);
    }
    echo.join().map_err(|_| "the echo thread panicked".to_string())??;
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(ns) => println!("{ns:.0}"),
        Err(e) => {
            eprintln!("core-latency: {e}");
            std::process::exit(2);
        }
    }
}
