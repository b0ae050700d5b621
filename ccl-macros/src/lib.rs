//! `#[derive(Reduce)]` for ccl. Use it through `ccl::Reduce`; the traits and
//! their documentation live in `ccl`.
//!
//! The derive is thin: parse, collect every problem as a spanned error,
//! expand inside `const _: () = { ... };`. It never panics: bad input is a
//! compile error pointing at the offending token.

#![deny(missing_docs)]

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Derives `ccl::Reduce` and field-wise `ccl::ReduceOp` for `Sum`, `Prod`,
/// `Min` and `Max`. A field marked `#[reduce(sum|prod|min|max)]` always uses
/// that operator, whichever one the call names.
#[proc_macro_derive(Reduce, attributes(reduce))]
pub fn derive_reduce(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    match expand::derive(&input) {
        Ok(ts) => ts.into(),
        Err(e) => e.into_compile_error().into(),
    }
}
