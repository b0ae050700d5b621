//! A user-defined operator and a derived struct reduction.

use ccl::testing::run_local;
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
    let out = run_local(4, |g| -> ccl::Result<(f32, Moments)> {
        let r = g.rank() as f32;
        let mut v = [if g.rank() == 2 { -10.0 } else { r }];
        g.typed::<f32>().all_reduce(&mut v, AbsMax)?;
        let mut m = [Moments { n: 1, sum: f64::from(r), peak: r * r }];
        g.typed::<Moments>().all_reduce(&mut m, Sum)?;
        Ok((v[0], m[0]))
    });
    for (rank, r) in out.into_iter().enumerate() {
        let (absmax, m) = r?;
        println!("rank {rank}: absmax {absmax}, moments {m:?}");
        assert_eq!(absmax, -10.0);
        assert_eq!(m, Moments { n: 4, sum: 6.0, peak: 9.0 });
    }
    Ok(())
}
