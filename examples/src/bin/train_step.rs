//! A data-parallel training step with ranks as threads: each rank computes
//! the gradient of a least-squares loss on its shard, all-reduce averages
//! the gradients, every rank applies the same update, and the weights end
//! identical on every rank (checked bit for bit).

use ccl::testing::run_local;
use ccl::Avg;
use rand::{Rng, SeedableRng};

const DIM: usize = 64;
const ROWS_PER_RANK: usize = 256;

fn main() -> ccl::Result<()> {
    let ranks = 4;
    let out = run_local(ranks, |g| -> ccl::Result<(Vec<f32>, f32)> {
        let comm = g.typed::<f32>();
        // this rank's shard of a synthetic regression problem y = x·w*
        let mut rng = rand::rngs::StdRng::seed_from_u64(g.rank() as u64);
        let truth: Vec<f32> = (0..DIM).map(|i| (i as f32 * 0.1).sin()).collect();
        let xs: Vec<Vec<f32>> =
            (0..ROWS_PER_RANK).map(|_| (0..DIM).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect();
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
        Ok((w, loss))
    });
    let results: Vec<(Vec<f32>, f32)> = out.into_iter().collect::<ccl::Result<_>>()?;
    for (rank, (w, loss)) in results.iter().enumerate() {
        println!("rank {rank}: local loss {loss:.5}, w[0..3] = {:?}", &w[..3]);
        assert_eq!(w, &results[0].0, "weights differ between rank 0 and rank {rank}");
    }
    Ok(())
}
