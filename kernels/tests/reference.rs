//! Every kernel against a scalar reference on fresh random data, at lengths
//! that are not multiples of any vector width or block size.

use ccl_kernels::{Arith, ArithOp, BitOp, Bitwise};
use half::{bf16, f16};
use rand::distributions::{Distribution, Standard};
use rand::Rng;

const LENS: [usize; 7] = [0, 1, 7, 64, 255, 257, 1029];
const OPS: [ArithOp; 4] = [ArithOp::Sum, ArithOp::Prod, ArithOp::Min, ArithOp::Max];

fn random_vec<T>(n: usize) -> Vec<T>
where
    Standard: Distribution<T>,
{
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen()).collect()
}

fn scalar_ref<T: Copy>(a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> Vec<T> {
    a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect()
}

fn check_arith<T: Arith + PartialEq + std::fmt::Debug>(
    gen: impl Fn(usize) -> Vec<T>,
    reference: impl Fn(ArithOp, T, T) -> T,
) {
    for &n in &LENS {
        for op in OPS {
            let a = gen(n);
            let b = gen(n);
            let want = scalar_ref(&a, &b, |x, y| reference(op, x, y));
            let mut got = a.clone();
            T::reduce_into(op, &mut got, &b);
            assert_eq!(got, want, "reduce_into {op:?} n={n}");
            let mut got3 = gen(n);
            T::reduce3(op, &mut got3, &a, &b);
            assert_eq!(got3, want, "reduce3 {op:?} n={n}");
        }
    }
}

macro_rules! int_ref {
    ($($t:ty => $name:ident),*) => {$(
        #[test]
        fn $name() {
            check_arith::<$t>(random_vec, |op, a, b| match op {
                ArithOp::Sum => a.wrapping_add(b),
                ArithOp::Prod => a.wrapping_mul(b),
                ArithOp::Min => std::cmp::min(a, b),
                ArithOp::Max => std::cmp::max(a, b),
            });
            for &n in &LENS {
                for op in [BitOp::And, BitOp::Or, BitOp::Xor] {
                    let a: Vec<$t> = random_vec(n);
                    let b: Vec<$t> = random_vec(n);
                    let want = scalar_ref(&a, &b, |x, y| match op {
                        BitOp::And => x & y,
                        BitOp::Or => x | y,
                        BitOp::Xor => x ^ y,
                    });
                    let mut got = a.clone();
                    <$t>::bits_into(op, &mut got, &b);
                    assert_eq!(got, want);
                    let mut got3 = vec![0; n];
                    <$t>::bits3(op, &mut got3, &a, &b);
                    assert_eq!(got3, want);
                }
            }
        }
    )*};
}

int_ref!(i8 => i8_ops, i16 => i16_ops, i32 => i32_ops, i64 => i64_ops,
         u8 => u8_ops, u16 => u16_ops, u32 => u32_ops, u64 => u64_ops);

fn float_ref<T: PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(op: ArithOp, a: T, b: T) -> T {
    match op {
        ArithOp::Sum => a + b,
        ArithOp::Prod => a * b,
        ArithOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        ArithOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

#[test]
fn f32_ops() {
    check_arith::<f32>(|n| random_vec::<f32>(n).into_iter().map(|x| x * 200.0 - 100.0).collect(), float_ref);
}

#[test]
fn f64_ops() {
    check_arith::<f64>(|n| random_vec::<f64>(n).into_iter().map(|x| x * 200.0 - 100.0).collect(), float_ref);
}

/// Half types are reduced through f32 and rounded once, so the reference
/// is exactly that: widen, apply, round.
#[test]
fn f16_ops() {
    check_arith::<f16>(
        |n| random_vec::<f32>(n).into_iter().map(|x| f16::from_f32(x * 8.0 - 4.0)).collect(),
        |op, a, b| f16::from_f32(float_ref(op, a.to_f32(), b.to_f32())),
    );
}

#[test]
fn bf16_ops() {
    check_arith::<bf16>(
        |n| random_vec::<f32>(n).into_iter().map(|x| bf16::from_f32(x * 8.0 - 4.0)).collect(),
        |op, a, b| bf16::from_f32(float_ref(op, a.to_f32(), b.to_f32())),
    );
}

#[test]
fn averages_divide_by_rank_count() {
    let mut v = vec![10.0f32, -3.0];
    f32::div_assign(&mut v, 4);
    assert_eq!(v, [2.5, -0.75]);
    let mut h = vec![bf16::from_f32(9.0)];
    bf16::div_assign(&mut h, 3);
    assert_eq!(h[0].to_f32(), 3.0);
    let mut i = vec![-7i32, 7];
    i32::div_assign(&mut i, 2);
    assert_eq!(i, [-3, 3]);
}

#[test]
fn copy_moves_common_length() {
    let src: Vec<u32> = random_vec(100);
    let mut dst = vec![0u32; 60];
    ccl_kernels::copy(&mut dst, &src);
    assert_eq!(dst[..], src[..60]);
}
