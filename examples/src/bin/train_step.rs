//! A data-parallel training step: each rank computes the gradient of a
//! least-squares loss on its own shard, all-reduce averages the gradients,
//! every rank applies the same update. At the end the weights must be
//! identical on every rank (checked: element-wise min and max over ranks
//! agree bit for bit). `cclrun -np 4 target/release/train_step`.

use ccl::{Avg, Max, Min};
use rand::{Rng, SeedableRng};

const DIM: usize = 64;
const ROWS_PER_RANK: usize = 256;

fn main() -> ccl::Result<()> {
    let world = ccl::init()?;
    let comm = world.typed::<f32>();
    // this rank's shard of a synthetic regression problem y = x·w*
    let mut rng = rand::rngs::StdRng::seed_from_u64(world.rank() as u64);
    let truth: Vec<f32> = (0..DIM).map(|i| (i as f32 * 0.1).sin()).collect();
    let xs: Vec<Vec<f32>> = (0..ROWS_PER_RANK).map(|_| (0..DIM).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
    let ys: Vec<f32> = xs.iter().map(|x| x.iter().zip(&truth).map(|(a, b)| a * b).sum()).collect();
    let mut w = vec![0f32; DIM];
    let mut loss = 0.0;
    for _step in 0..50 {
        let mut grad = vec![0f32; DIM];
        loss = 0.0;
        for (x, y) in xs.iter().zip(&ys) {
            let err = x.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() - y;
            loss += err * err / ROWS_PER_RANK as f32;
            for (gi, xi) in grad.iter_mut().zip(x) {
                *gi += 2.0 * err * xi / ROWS_PER_RANK as f32;
            }
        }
        comm.all_reduce(&mut grad, Avg)?;
        for (wi, gi) in w.iter_mut().zip(&grad) {
            *wi -= 0.1 * gi;
        }
    }
    let (mut lo, mut hi) = (w.clone(), w.clone());
    comm.all_reduce(&mut lo, Min)?;
    comm.all_reduce(&mut hi, Max)?;
    let same = lo.iter().zip(&hi).zip(&w).all(|((a, b), c)| a.to_bits() == c.to_bits() && b.to_bits() == c.to_bits());
    println!("rank {}: local loss {loss:.5}, weights identical on all {} ranks: {same}", world.rank(), world.size());
    if !same {
        std::process::exit(1);
    }
    Ok(())
}
