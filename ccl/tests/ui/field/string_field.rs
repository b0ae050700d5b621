#[derive(Clone, ccl::Reduce)]
struct Named {
    value: f64,
    name: String,
}

fn main() {}
