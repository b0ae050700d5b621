#[derive(Clone, Copy, ccl::Reduce)]
struct Stats {
    #[reduce(median)]
    value: f64,
}

fn main() {}
