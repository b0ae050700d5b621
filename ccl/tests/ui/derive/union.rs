#[derive(Clone, Copy, ccl::Reduce)]
union Bits {
    f: f32,
    u: u32,
}

fn main() {}
