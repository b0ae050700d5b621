#[derive(Clone, Copy, ccl::Reduce)]
struct Nothing {}

fn main() {}
