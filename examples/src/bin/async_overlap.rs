//! Collectives awaited on tokio: two all-reduces start, run while this
//! rank computes, and are awaited together. A ccl request is a future; the
//! group's own thread drives the calls once they are awaited (here by the
//! tasks spawned for them) and wakes each task as its call finishes.
//! `cclrun -np 4 target/release/async_overlap`.

use ccl::{Max, Sum};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ccl::Result<()> {
    let world = ccl::init()?;
    let (r, n) = (world.rank(), world.size());
    // a large call and a small one, each awaited by a task of its own
    let grads = tokio::spawn(world.typed::<f64>().iall_reduce(vec![r as f64 + 1.0; 1 << 20], Sum));
    let steps = tokio::spawn(world.typed::<u64>().iall_reduce(vec![r as u64; 4], Max));
    // the computation they overlap
    let local: f64 = (1..=2_000_000u32).map(|i| 1.0 / f64::from(i) / f64::from(i)).sum();
    let join = |e: tokio::task::JoinError| ccl::Error::new(ccl::ErrorKind::InvalidArgument(e.to_string()));
    let (grads, steps) = tokio::join!(grads, steps);
    let (grads, steps) = (grads.map_err(join)??, steps.map_err(join)??);
    let want = (n * (n + 1) / 2) as f64;
    let right = grads.iter().all(|&g| g == want) && steps == vec![n as u64 - 1; 4];
    println!("async_overlap: rank {r} of {n}: sums right: {right}, computed {local:.6} meanwhile");
    world.finalize()?;
    Ok(())
}
