use ccl::testing::run_local;

fn main() {
    run_local(2, |g| {
        let _ = g.typed::<bool>();
    });
}
