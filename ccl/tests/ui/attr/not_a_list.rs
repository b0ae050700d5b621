#[derive(Clone, Copy, ccl::Reduce)]
struct Stats {
    #[reduce = "max"]
    value: f64,
}

fn main() {}
