use ccl::{testing::run_local, Avg, Reduce};

#[derive(Clone, Copy, Reduce)]
struct Pair {
    a: f32,
    b: i64,
}

fn main() {
    run_local(2, |g| {
        let mut v = [Pair { a: 1.0, b: 2 }];
        g.typed::<Pair>().all_reduce(&mut v, Avg)
    });
}
