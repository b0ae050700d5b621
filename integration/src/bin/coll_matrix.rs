//! Every collective × type × operator × count, checked against a
//! sequential reference, on ranks started by cclrun. Rank 0 draws the seed
//! and broadcasts it (or takes CCL_TEST_SEED).

#[path = "../../../ccl/tests/common/mod.rs"]
#[allow(missing_docs, clippy::all)]
mod common;

fn main() {
    let (g, seed) = common::world_and_seed();
    match common::matrix::everything(&g, seed) {
        Ok(()) => println!("rank {} of {}: all collectives correct", g.rank(), g.size()),
        Err(e) => {
            eprintln!("rank {}: {e} (CCL_TEST_SEED={seed})", g.rank());
            std::process::exit(1);
        }
    }
}
