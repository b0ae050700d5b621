#[derive(Clone, Copy, ccl::Reduce)]
struct Stats {
    #[reduce(max)]
    #[reduce(min)]
    value: f64,
}

fn main() {}
