use ccl::{testing::run_local, BitAnd};

fn main() {
    run_local(2, |g| {
        let mut v = vec![1.0f32; 4];
        g.typed::<f32>().all_reduce(&mut v, BitAnd)
    });
}
