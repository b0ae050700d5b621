//! Random data and a straightforward reference for the collective tests.
#![allow(dead_code)]

pub mod gpu_matrix;
pub mod matrix;
pub mod varying;

use ccl::{Reduce, ReduceOp};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Element types the tests can draw and compare.
pub trait Elem: Reduce + std::fmt::Debug + PartialEq {
    /// A random value; `small` keeps it an integer in -3..=3 (so float sums
    /// and products are exact in any order).
    fn draw(rng: &mut StdRng, small: bool) -> Self;
    /// Equal, or close enough for a float reduced in another order.
    fn close(a: Self, b: Self, n: usize) -> bool;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn draw(rng: &mut StdRng, small: bool) -> Self {
                if small { rng.gen_range(0..=3) as $t } else { rng.gen() }
            }
            fn close(a: Self, b: Self, _n: usize) -> bool { a == b }
        }
    )*};
}
int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_elem {
    ($($t:ty => $eps:expr),*) => {$(
        impl Elem for $t {
            fn draw(rng: &mut StdRng, small: bool) -> Self {
                if small { rng.gen_range(-3i32..=3) as $t } else { rng.gen_range(-1.0..1.0) }
            }
            fn close(a: Self, b: Self, n: usize) -> bool {
                a == b || (a - b).abs() <= $eps * (n as $t) * (1.0 + a.abs().max(b.abs()))
            }
        }
    )*};
}
float_elem!(f32 => 1e-5, f64 => 1e-12);

macro_rules! half_elem {
    ($($t:ty => $eps:expr),*) => {$(
        impl Elem for $t {
            fn draw(rng: &mut StdRng, small: bool) -> Self {
                <$t>::from_f32(if small { rng.gen_range(-3i32..=3) as f32 } else { rng.gen_range(-1.0..1.0) })
            }
            fn close(a: Self, b: Self, n: usize) -> bool {
                let (x, y) = (a.to_f32(), b.to_f32());
                x == y || (x - y).abs() <= $eps * n as f32 * (1.0 + x.abs().max(y.abs()))
            }
        }
    )*};
}
half_elem!(f16 => 2e-3, bf16 => 1.6e-2);

/// Rank `rank`'s input for call `call` of a test seeded `seed`.
pub fn input<T: Elem>(seed: u64, call: u64, rank: usize, len: usize, small: bool) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed ^ (call << 20) ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..len).map(|_| T::draw(&mut rng, small)).collect()
}

/// The reduction of every rank's input, folded in rank order.
pub fn reference<T: Elem, O: ReduceOp<T>>(inputs: &[Vec<T>]) -> Vec<T> {
    let mut acc = inputs[0].clone();
    for v in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(v) {
            *a = O::combine(*a, *b);
        }
    }
    O::finish(&mut acc, inputs.len());
    acc
}

/// Compares element-wise, describing the first difference.
pub fn compare<T: Elem>(what: &str, got: &[T], want: &[T], n: usize) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| !T::close(*a, *b, n)) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: element {i} is {:?}, expected {:?}", got[i], want[i])),
    }
}

/// A fresh seed per test run, printed so a failure can be replayed with
/// `CCL_TEST_SEED`.
pub fn seed() -> u64 {
    let s = std::env::var("CCL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("seed {s} (CCL_TEST_SEED={s} replays it)");
    s
}

/// For a rank started by cclrun: its world (exits 2 if init fails) and
/// the seed rank 0 drew (or took from `CCL_TEST_SEED`), broadcast to all.
pub fn world_and_seed() -> (ccl::Group, u64) {
    let g = match ccl::init() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("init: {e}");
            std::process::exit(2);
        }
    };
    let mut seed =
        [std::env::var("CCL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>)];
    if let Err(e) = g.typed::<u64>().broadcast(&mut seed, 0) {
        eprintln!("seed broadcast: {e}");
        std::process::exit(1);
    }
    (g, seed[0])
}
