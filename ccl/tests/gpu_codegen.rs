//! `#[derive(Reduce)]` emits CUDA C for its struct: the same size, alignment
//! and field offsets as Rust's layout (padding spelled out), field-wise
//! Sum/Prod/Min/Max honouring `#[reduce(...)]`, nested and generic structs.
//! With feature `cuda` and NVRTC present (scripts/deps.sh cuda), every
//! test type's kernels compile to PTX for sm_80 and sm_90.

#[cfg(feature = "cuda")]
use ccl::gpu::codegen;
use ccl::gpu::Kernels;
use ccl::{Max, Min, Reduce, Sum};

mod common;

use common::matrix::Moments;

#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
struct Inner(u32, #[reduce(min)] i16);

#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
struct Outer<T: Copy> {
    inner: Inner,
    #[reduce(prod)]
    scale: T,
}

#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
struct Mixed {
    a: u8,
    b: half::f16,
    c: i64,
    d: half::bf16,
}

fn defs<T: Reduce>() -> (String, String) {
    let mut defs = String::new();
    let name = T::cuda_type(&mut defs).expect("derived types have CUDA C");
    (name, defs)
}

#[test]
fn the_struct_matches_rusts_layout() {
    let (name, d) = defs::<Moments>();
    assert!(d.contains(&format!("static_assert(sizeof({name}) == {}", std::mem::size_of::<Moments>())), "{d}");
    assert!(d.contains(&format!("struct __align__({}) {name} {{", std::mem::align_of::<Moments>())), "{d}");
    // peak keeps Max under every operator; n and sum follow the struct's
    assert!(d.contains("r.f2 = Max<f32>::f(a.f2, b.f2);"), "{d}");
    assert!(
        d.contains(&format!("template <> struct Min<{name}>")) && d.contains("r.f0 = Min<u64>::f(a.f0, b.f0);"),
        "{d}"
    );
    // field offsets in declaration order of the CUDA struct follow Rust's
    let decl = d.lines().find(|l| l.starts_with("struct")).unwrap_or_default().to_string();
    let order = [
        (std::mem::offset_of!(Moments, n), "u64 f0;"),
        (std::mem::offset_of!(Moments, sum), "f64 f1;"),
        (std::mem::offset_of!(Moments, peak), "f32 f2;"),
    ];
    let mut sorted = order;
    sorted.sort();
    let pos: Vec<usize> = sorted.iter().map(|(_, f)| decl.find(f).unwrap_or(usize::MAX)).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]), "{decl}");
}

#[test]
fn nested_and_generic_structs_define_their_parts_once() {
    let (name, d) = defs::<Outer<f64>>();
    let (inner, _) = defs::<Inner>();
    assert_eq!(d.matches(&format!("struct __align__(4) {inner} {{")).count(), 1, "{d}");
    assert!(d.find(&inner).unwrap_or(usize::MAX) < d.find(&format!("{name} {{")).unwrap_or(0), "{d}");
    assert!(d.contains("Prod<f64>::f(a.f1, b.f1)") && d.contains(&format!("Sum<{inner}>::f(a.f0, b.f0)")), "{d}");
    assert!(d.contains("r.f1 = Min<i16>::f(a.f1, b.f1);"), "inner's pinned min: {d}");
    let (other, _) = defs::<Outer<f32>>();
    assert_ne!(name, other, "generic instances need their own CUDA names");
    let (_, d) = defs::<Mixed>();
    assert!(d.contains("f16 f1;") && d.contains("bf16 f3;") && d.contains("i64 f2;"), "{d}");
}

#[test]
fn derived_kernels_are_named_for_every_struct_operator() {
    let k = Kernels::of::<Moments, Sum>().expect("must succeed");
    let (name, _) = defs::<Moments>();
    assert_eq!(k.reduce.as_deref(), Some(format!("ccl_reduce_Sum_{name}").as_str()));
    assert!(k.source.contains(&format!("CCL_STRUCT({name})")));
    assert!(Kernels::of::<Outer<f32>, Max>().is_ok() && Kernels::of::<Inner, Min>().is_ok());
}

/// NVRTC compiles every derived test type's kernels for sm_80 and sm_90.
#[cfg(feature = "cuda")]
#[test]
fn derived_kernels_compile_with_nvrtc() {
    use ccl_kernels::cuda;
    if !cuda::nvrtc_available() || cuda::include_dir().is_none() {
        assert!(std::env::var("CCL_TEST_REQUIRE_ALL").as_deref() != Ok("1"), "NVRTC or CUDA headers missing");
        eprintln!("SKIPPED: NVRTC or the CUDA headers are missing");
        return;
    }
    let types: Vec<(String, String)> =
        vec![defs::<Moments>(), defs::<Inner>(), defs::<Outer<f32>>(), defs::<Outer<f64>>(), defs::<Mixed>()];
    for (name, d) in types {
        let src = codegen::source(&d, &name);
        for arch in ["sm_80", "sm_90"] {
            let ptx = cuda::compile(&src, arch).unwrap_or_else(|e| panic!("{name} {arch}: {e}\n{src}"));
            for k in codegen::kernel_names(&name) {
                assert!(ptx.contains(&format!(".entry {k}(")), "{arch}: {k} missing");
            }
        }
    }
}
