//! Every rank says who and where it is, then they agree on a sum.
//! `cargo run --bin hello` (a world of one) or `cclrun -np 4 target/release/hello`.

fn main() -> ccl::Result<()> {
    let world = ccl::init()?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut v = [world.rank() as u64];
    world.typed::<u64>().all_reduce(&mut v, ccl::Sum)?;
    println!("hello from rank {} of {} on {} (sum of ranks {})", world.rank(), world.size(), host.trim(), v[0]);
    Ok(())
}
