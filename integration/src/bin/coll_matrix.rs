//! Every collective × type × operator × count, checked against a
//! sequential reference, on ranks started by cclrun. Rank 0 draws the seed
//! and broadcasts it (or takes CCL_TEST_SEED).

#[path = "../../../ccl/tests/common/mod.rs"]
#[allow(missing_docs, clippy::all)]
mod common;

fn main() {
    let g = match ccl::init() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("init: {e}");
            std::process::exit(2);
        }
    };
    let mut seed =
        [std::env::var("CCL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>)];
    if let Err(e) = g.typed::<u64>().broadcast(&mut seed, 0) {
        eprintln!("seed broadcast: {e}");
        std::process::exit(1);
    }
    match common::matrix::everything(&g, seed[0]) {
        Ok(()) => println!("rank {} of {}: all collectives correct", g.rank(), g.size()),
        Err(e) => {
            eprintln!("rank {}: {e} (CCL_TEST_SEED={})", g.rank(), seed[0]);
            std::process::exit(1);
        }
    }
}
