#[derive(Clone, Copy, ccl::Reduce)]
struct Flagged {
    value: f64,
    seen: bool,
}

fn main() {}
