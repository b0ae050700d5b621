#[derive(Clone, Copy, ccl::Reduce)]
enum Level {
    Low,
    High,
}

fn main() {}
