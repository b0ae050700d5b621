//! CUDA C for derived structs: `#[derive(Reduce)]` describes a struct's
//! fields (offset, CUDA type, pinned operator) and this module writes the
//! matching CUDA struct — same size, alignment and field offsets, padding
//! spelled out — and its field-wise `Sum`, `Prod`, `Min` and `Max`, then
//! the source that instantiates copy, reduce and receive-reduce-send for it.

use std::fmt::Write;

/// The operators a derived struct reduces by (field-wise).
pub const STRUCT_OPS: [&str; 4] = ["Sum", "Prod", "Min", "Max"];

/// One field of a derived struct.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Byte offset in the Rust struct (`core::mem::offset_of!`).
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// The field type's CUDA name (`"f32"`, or another derived struct's).
    pub ty: String,
    /// The operator the field always takes (`#[reduce(max)]` → `"Max"`),
    /// else the struct's.
    pub op: Option<&'static str>,
}

/// A CUDA identifier for the Rust type `rust_name` with these fields
/// (generic instances differ by their fields' types).
pub fn struct_name(rust_name: &str, fields: &[Field]) -> String {
    let mut id: String = rust_name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>();
    id = id.split('_').filter(|s| !s.is_empty()).collect::<Vec<_>>().join("_");
    // FNV-1a over the field types and offsets tells generic instances apart
    let mut h: u32 = 0x811c_9dc5;
    for f in fields {
        for b in f.ty.bytes().chain(f.offset.to_le_bytes()) {
            h = (h ^ b as u32).wrapping_mul(0x0100_0193);
        }
    }
    format!("ccl_struct_{id}_{h:08x}")
}

/// Appends the definition of struct `name` and its four field-wise
/// operators to `defs`, unless `defs` has it already. `fields` may come in
/// any order; they must not overlap and must fit in `size`.
pub fn define_struct(defs: &mut String, name: &str, size: usize, align: usize, fields: &[Field]) {
    if defs.contains(&format!("struct __align__({align}) {name} {{")) {
        return;
    }
    let mut order: Vec<(usize, &Field)> = fields.iter().enumerate().collect();
    order.sort_by_key(|(_, f)| f.offset);
    let mut body = String::new();
    let mut at = 0;
    for (i, f) in &order {
        if f.offset > at {
            let _ = write!(body, " u8 pad{at}[{}];", f.offset - at);
        }
        let _ = write!(body, " {} f{i};", f.ty);
        at = f.offset + f.size;
    }
    if size > at {
        let _ = write!(body, " u8 pad{at}[{}];", size - at);
    }
    let _ = writeln!(defs, "struct __align__({align}) {name} {{{body} }};");
    let _ = writeln!(defs, "static_assert(sizeof({name}) == {size}, \"{name}: size differs from Rust's\");");
    for op in STRUCT_OPS {
        let mut lines = String::new();
        for (i, f) in fields.iter().enumerate() {
            let fop = f.op.unwrap_or(op);
            let _ = write!(lines, " r.f{i} = {fop}<{}>::f(a.f{i}, b.f{i});", f.ty);
        }
        let _ = writeln!(
            defs,
            "template <> struct {op}<{name}> {{ __device__ static {name} f({name} a, {name} b) {{ {name} r = a;{lines} return r; }} }};"
        );
    }
}

/// The CUDA source of a derived type's kernels: the shared templates, the
/// definitions `defs` (the struct and any nested ones), then copy, reduce
/// and receive-reduce-send for `name` and each of [`STRUCT_OPS`].
pub fn source(defs: &str, name: &str) -> String {
    let shared = super::SOURCE.split(super::PRIMITIVES_MARK).next().unwrap_or(super::SOURCE);
    format!("{shared}// ---- derived type {name}\n{defs}CCL_STRUCT({name})\n")
}

/// The kernel names of a derived type `name` (PTX entry points).
pub fn kernel_names(name: &str) -> Vec<String> {
    let mut v = vec![format!("ccl_copy_{name}")];
    for op in STRUCT_OPS {
        v.push(format!("ccl_reduce_{op}_{name}"));
        v.push(format!("ccl_recv_reduce_send_{op}_{name}"));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(offset: usize, size: usize, ty: &str, op: Option<&'static str>) -> Field {
        Field { offset, size, ty: ty.into(), op }
    }

    #[test]
    fn padding_is_spelled_out_and_ops_go_field_by_field() {
        // Rust may reorder: the f64 first, then the f32, then the u8, padded to 16
        let fields = [field(8, 4, "f32", None), field(0, 8, "f64", Some("Max")), field(12, 1, "u8", None)];
        let name = struct_name("my_crate::Moments", &fields);
        assert!(name.starts_with("ccl_struct_my_crate_Moments_"), "{name}");
        let mut defs = String::new();
        define_struct(&mut defs, &name, 16, 8, &fields);
        assert!(
            defs.contains(&format!("struct __align__(8) {name} {{ f64 f1; f32 f0; u8 f2; u8 pad13[3]; }};")),
            "{defs}"
        );
        assert!(defs.contains("r.f0 = Sum<f32>::f(a.f0, b.f0); r.f1 = Max<f64>::f(a.f1, b.f1);"), "{defs}");
        assert!(defs.contains("r.f1 = Max<f64>::f(a.f1, b.f1); r.f2 = Min<u8>"), "{defs}");
        let once = defs.clone();
        define_struct(&mut defs, &name, 16, 8, &fields);
        assert_eq!(defs, once, "defined twice");
        let src = source(&defs, &name);
        assert!(src.contains("CCL_STRUCT(") && !src.contains("CCL_INT(i8)"));
        assert_eq!(kernel_names(&name).len(), 9);
    }

    #[test]
    fn generic_instances_get_different_names() {
        let a = struct_name("m::Pair", &[field(0, 4, "f32", None), field(4, 4, "f32", None)]);
        let b = struct_name("m::Pair", &[field(0, 8, "f64", None), field(8, 8, "f64", None)]);
        assert_ne!(a, b);
    }
}
