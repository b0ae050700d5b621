//! A user-defined operator and a derived struct reduction.
//! `cclrun -np 4 target/release/custom_op` (or alone, as a world of one).

use ccl::{Op, Reduce, ReduceOp, Sum};

/// Keeps the value of larger magnitude, sign included.
#[derive(Clone, Copy, Debug, Default)]
struct AbsMax;

impl Op for AbsMax {
    const NAME: &'static str = "absmax";
}

impl ReduceOp<f32> for AbsMax {
    fn combine(a: f32, b: f32) -> f32 {
        if b.abs() > a.abs() {
            b
        } else {
            a
        }
    }
}

/// Running statistics: counts and sums add, the peak takes the maximum.
#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
struct Moments {
    n: u64,
    sum: f64,
    #[reduce(max)]
    peak: f32,
}

fn main() -> ccl::Result<()> {
    let g = ccl::init()?;
    let (n, r) = (g.size(), g.rank() as f32);
    let mut v = [if g.rank() == n / 2 { -10.0 * n as f32 } else { r }];
    g.typed::<f32>().all_reduce(&mut v, AbsMax)?;
    let mut m = [Moments { n: 1, sum: f64::from(r), peak: r * r }];
    g.typed::<Moments>().all_reduce(&mut m, Sum)?;
    println!("rank {}: absmax {}, moments {:?}", g.rank(), v[0], m[0]);
    let last = (n - 1) as f32;
    let want = Moments { n: n as u64, sum: (n * (n - 1) / 2) as f64, peak: last * last };
    if v[0] != -10.0 * n as f32 || m[0] != want {
        eprintln!("rank {}: expected absmax {} and {want:?}", g.rank(), -10.0 * n as f32);
        std::process::exit(1);
    }
    Ok(())
}
