//! Compile-time guarantees, proved with trybuild: an operator a type cannot
//! do, a derive on an enum or union, a field that is not `Reduce`, and a
//! malformed `#[reduce(...)]` are compile errors with readable messages.
//! Regenerate the expected output with `TRYBUILD=overwrite`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/op/*.rs");
    t.compile_fail("tests/ui/derive/*.rs");
    t.compile_fail("tests/ui/field/*.rs");
    t.compile_fail("tests/ui/attr/*.rs");
}
