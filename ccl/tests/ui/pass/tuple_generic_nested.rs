use ccl::{Max, Min, Prod, Reduce, ReduceOp, Sum};

#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
struct Inner(u32, #[reduce(min)] i16);

#[derive(Clone, Copy, Debug, PartialEq, Reduce)]
struct Outer<T: Copy> {
    inner: Inner,
    #[reduce(prod)]
    scale: T,
}

fn main() {
    let a = Outer { inner: Inner(2, -1), scale: 3.0f32 };
    let b = Outer { inner: Inner(5, 4), scale: 2.0f32 };
    assert_eq!(<Sum as ReduceOp<_>>::combine(a, b), Outer { inner: Inner(7, -1), scale: 6.0 });
    assert_eq!(<Max as ReduceOp<_>>::combine(a, b), Outer { inner: Inner(5, -1), scale: 6.0 });
    let _ = <Min as ReduceOp<Outer<f64>>>::combine;
    let _ = <Prod as ReduceOp<Inner>>::combine;
    assert!(<Outer<f32> as Reduce>::NAME.ends_with("Outer"));
}
