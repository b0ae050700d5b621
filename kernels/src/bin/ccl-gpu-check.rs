//! `ccl-gpu-check`: runs ccl's CUDA kernels on GPU 0 and checks them
//! against a host reference (build here with `--features cuda`, run on a
//! machine with a GPU: `integration/gpu/check.sh`).
//!
//! For each type and operator: fresh random inputs, the output poisoned
//! first, `ccl_reduce_*`, `ccl_recv_reduce_send_*` (into output and next
//! slot at once) and `ccl_copy_*` launched on one stream, results compared
//! element by element. Then device-to-device copy bandwidth, the ceiling
//! for GPU collectives. Prints a table last; exits 1 on any wrong element,
//! 2 when there is no driver or GPU (an error, never a panic).

use ccl_kernels::cuda;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use half::{bf16, f16};
use std::sync::Arc;
use std::time::Instant;

type Fail = Box<dyn std::error::Error>;

/// An element type the check covers: its CUDA name, random values and the
/// host reference of each operator.
trait Elem: DeviceRepr + ValidAsZeroBits + Copy + PartialEq + std::fmt::Debug + Unpin + 'static {
    const NAME: &'static str;
    const INT: bool;
    fn random(i: usize, seed: u64) -> Self;
    fn poison() -> Self;
    fn op(op: &str, a: Self, b: Self) -> Self;
}

fn mix(i: usize, seed: u64) -> u64 {
    let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^ (x >> 29)
}

macro_rules! int_elem {
    ($t:ty, $n:literal) => {
        impl Elem for $t {
            const NAME: &'static str = $n;
            const INT: bool = true;
            fn random(i: usize, seed: u64) -> Self {
                mix(i, seed) as $t
            }
            fn poison() -> Self {
                0x5a as $t
            }
            fn op(op: &str, a: Self, b: Self) -> Self {
                match op {
                    "Sum" => a.wrapping_add(b),
                    "Prod" => a.wrapping_mul(b),
                    "Min" => a.min(b),
                    "Max" => a.max(b),
                    "BitAnd" => a & b,
                    "BitOr" => a | b,
                    _ => a ^ b,
                }
            }
        }
    };
}
int_elem!(i8, "i8");
int_elem!(u8, "u8");
int_elem!(i16, "i16");
int_elem!(u16, "u16");
int_elem!(i32, "i32");
int_elem!(u32, "u32");
int_elem!(i64, "i64");
int_elem!(u64, "u64");

macro_rules! float_elem {
    ($t:ty, $n:literal, $from:expr, $to:expr, $back:expr) => {
        impl Elem for $t {
            const NAME: &'static str = $n;
            const INT: bool = false;
            fn random(i: usize, seed: u64) -> Self {
                // small integers and halves: every operation is exact or rounds once
                $from(((mix(i, seed) % 64) as f32 - 32.0) / 2.0)
            }
            fn poison() -> Self {
                $from(-12345.0)
            }
            fn op(op: &str, a: Self, b: Self) -> Self {
                let (x, y) = ($to(a), $to(b));
                $back(match op {
                    "Sum" => x + y,
                    "Prod" => x * y,
                    "Min" => x.min(y),
                    _ => x.max(y),
                })
            }
        }
    };
}
float_elem!(f32, "f32", |v: f32| v, |v: f32| v, |v: f32| v);
float_elem!(f64, "f64", |v: f32| v as f64, |v: f64| v, |v: f64| v);
float_elem!(f16, "f16", f16::from_f32, |v: f16| v.to_f32(), f16::from_f32);
float_elem!(bf16, "bf16", bf16::from_f32, |v: bf16| v.to_f32(), bf16::from_f32);

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<cudarc::driver::CudaModule>,
}

fn upload<T: Elem>(s: &Arc<CudaStream>, v: &[T]) -> Result<CudaSlice<T>, Fail> {
    Ok(s.clone_htod(v)?)
}

/// Wrong elements of every kernel for type `T` (per operator).
fn check_type<T: Elem>(g: &Gpu, n: usize, seed: u64) -> Result<Vec<(String, usize)>, Fail> {
    let s = &g.stream;
    let a: Vec<T> = (0..n).map(|i| T::random(i, seed)).collect();
    let b: Vec<T> = (0..n).map(|i| T::random(i, seed ^ 0xabcdef)).collect();
    let (da, db) = (upload(s, &a)?, upload(s, &b)?);
    let cfg = LaunchConfig { grid_dim: (120, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let count = n as u64;
    let mut out = Vec::new();
    let ops: &[&str] = if T::INT { &cuda::OPS } else { &cuda::OPS[..4] };
    for op in ops {
        let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| T::op(op, x, y)).collect();
        let poison = vec![T::poison(); n];
        let mut dst = upload(s, &poison)?;
        let f = g.module.load_function(&format!("ccl_reduce_{op}_{}", T::NAME))?;
        // SAFETY: the kernel's signature is (T*, const T*, const T*, u64) and
        // every buffer holds n elements.
        unsafe { s.launch_builder(&f).arg(&mut dst).arg(&da).arg(&db).arg(&count).launch(cfg)? };
        let got = s.clone_dtoh(&dst)?;
        let bad = got.iter().zip(&want).filter(|(x, y)| x != y).count();
        // fused: reduce the "slot" with the local data into output and next slot
        let (mut o1, mut o2) = (upload(s, &poison)?, upload(s, &poison)?);
        let f = g.module.load_function(&format!("ccl_recv_reduce_send_{op}_{}", T::NAME))?;
        // SAFETY: (T* out, T* next, const T* slot, const T* local, u64), n each.
        unsafe { s.launch_builder(&f).arg(&mut o1).arg(&mut o2).arg(&da).arg(&db).arg(&count).launch(cfg)? };
        let (g1, g2) = (s.clone_dtoh(&o1)?, s.clone_dtoh(&o2)?);
        let bad2 = g1.iter().chain(&g2).zip(want.iter().chain(&want)).filter(|(x, y)| x != y).count();
        out.push((op.to_string(), bad + bad2));
    }
    let mut dst = upload(s, &vec![T::poison(); n])?;
    let f = g.module.load_function(&format!("ccl_copy_{}", T::NAME))?;
    // SAFETY: (T* dst, const T* src, u64), n each.
    unsafe { s.launch_builder(&f).arg(&mut dst).arg(&da).arg(&count).launch(cfg)? };
    let got = s.clone_dtoh(&dst)?;
    out.push(("copy".into(), got.iter().zip(&a).filter(|(x, y)| x != y).count()));
    Ok(out)
}

/// Device-to-device copy bandwidth, GB/s (bytes copied / time).
fn copy_bandwidth(g: &Gpu) -> Result<f64, Fail> {
    let n = 256usize << 20;
    let src: CudaSlice<u8> = g.stream.alloc_zeros(n)?;
    let mut dst: CudaSlice<u8> = g.stream.alloc_zeros(n)?;
    g.stream.memcpy_dtod(&src, &mut dst)?;
    g.stream.synchronize()?;
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        g.stream.memcpy_dtod(&src, &mut dst)?;
    }
    g.stream.synchronize()?;
    Ok((n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
}

fn run() -> Result<bool, Fail> {
    let ctx = CudaContext::new(0)?;
    let (major, minor) = ctx.compute_capability()?;
    let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
    let name = ctx.name().unwrap_or_default();
    let t = Instant::now();
    // CUBIN for this GPU, as ccl loads it (PTX only where NVRTC gives none)
    let image = cuda::image(cuda::SOURCE, arch)?;
    let compile = t.elapsed().as_secs_f64();
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image.bytes().to_vec()))?;
    let stream = ctx.default_stream();
    let g = Gpu { ctx, stream, module };
    let seed = std::env::var("CCL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let n = (1 << 20) + 17;
    let rows: Vec<(&str, Vec<(String, usize)>)> = vec![
        ("i8", check_type::<i8>(&g, n, seed)?),
        ("u8", check_type::<u8>(&g, n, seed)?),
        ("i16", check_type::<i16>(&g, n, seed)?),
        ("u16", check_type::<u16>(&g, n, seed)?),
        ("i32", check_type::<i32>(&g, n, seed)?),
        ("u32", check_type::<u32>(&g, n, seed)?),
        ("i64", check_type::<i64>(&g, n, seed)?),
        ("u64", check_type::<u64>(&g, n, seed)?),
        ("f32", check_type::<f32>(&g, n, seed)?),
        ("f64", check_type::<f64>(&g, n, seed)?),
        ("f16", check_type::<f16>(&g, n, seed)?),
        ("bf16", check_type::<bf16>(&g, n, seed)?),
    ];
    let bw = copy_bandwidth(&g)?;
    let _ = &g.ctx;
    println!("# ccl-gpu-check on {name} ({arch}), NVRTC {compile:.2} s, {n} elements, CCL_TEST_SEED={seed}");
    println!("# {:>5}  kernel(wrong elements)", "type");
    let mut wrong = 0;
    for (t, r) in &rows {
        let cells: Vec<String> = r.iter().map(|(k, w)| format!("{k}({w})")).collect();
        wrong += r.iter().map(|(_, w)| w).sum::<usize>();
        println!("  {t:>5}  {}", cells.join(" "));
    }
    println!("# device-to-device copy: {bw:.1} GB/s (256 MiB x 20)");
    println!("# wrong elements in all: {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" });
    Ok(wrong == 0)
}

fn main() {
    if !cuda::driver_available() {
        eprintln!("ccl-gpu-check: no CUDA driver (libcuda.so.1 cannot be loaded): nothing to run on");
        std::process::exit(2);
    }
    match std::panic::catch_unwind(run) {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => std::process::exit(1),
        Ok(Err(e)) => {
            eprintln!("ccl-gpu-check: {e}");
            std::process::exit(2);
        }
        Err(_) => {
            eprintln!("ccl-gpu-check: the CUDA libraries failed to load");
            std::process::exit(2);
        }
    }
}
