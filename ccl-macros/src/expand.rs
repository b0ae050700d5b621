//! Expansion of `#[derive(Reduce)]`.

use crate::attr::{field_override, FIELD_OPS};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

/// Expands the derive, or returns every problem found as one combined error.
pub fn derive(input: &syn::DeriveInput) -> syn::Result<TokenStream> {
    let data = match &input.data {
        syn::Data::Struct(s) => s,
        syn::Data::Enum(e) => {
            return Err(syn::Error::new(
                e.enum_token.span,
                "`#[derive(Reduce)]` needs a struct: an enum has values that are not valid for every bit pattern, so it cannot be reduced field-wise",
            ))
        }
        syn::Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                "`#[derive(Reduce)]` needs a struct: a union has no fields to reduce one by one",
            ))
        }
    };
    if data.fields.is_empty() {
        return Err(syn::Error::new(
            input.ident.span(),
            "`#[derive(Reduce)]` needs at least one field: a zero-sized element cannot be sent",
        ));
    }

    let mut errors: Option<syn::Error> = None;
    let mut fields = Vec::new();
    for (i, f) in data.fields.iter().enumerate() {
        let member = match &f.ident {
            Some(id) => syn::Member::Named(id.clone()),
            None => syn::Member::Unnamed(syn::Index::from(i)),
        };
        match field_override(f) {
            Ok(op) => fields.push((member, f.ty.clone(), op)),
            Err(e) => match &mut errors {
                Some(all) => all.combine(e),
                None => errors = Some(e),
            },
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }

    let name = &input.ident;
    let (impl_g, ty_g, where_clause) = input.generics.split_for_impl();
    let preds = where_clause.map(|w| w.predicates.iter().collect::<Vec<_>>()).unwrap_or_default();

    // Bounds are written higher-ranked (`for<'__ccl>`) so that a bound that
    // can never hold (a `String` field) does not fail at the impl, five
    // times over; instead one assertion per field, on the field's span,
    // says which field is not `Reduce`. Generic fields are checked where
    // the struct is used with concrete types.
    let generic = input.generics.type_params().next().is_some() || input.generics.const_params().next().is_some();
    let field_bounds = fields.iter().map(|(_, ty, _)| quote!(for<'__ccl> #ty: ::ccl::Reduce));
    let assertions = fields.iter().filter(|_| !generic).map(|(_, ty, _)| {
        quote_spanned! {ty.span()=>
            const _: fn() = || {
                fn field_must_be_reduce<T: ::ccl::Reduce>() {}
                field_must_be_reduce::<#ty>();
            };
        }
    });
    // CUDA C of the struct: each field's offset, size, CUDA type and pinned operator
    let cuda_fields = fields.iter().map(|(member, ty, pinned)| {
        let op = match pinned {
            Some(op) => quote!(::core::option::Option::Some(::core::stringify!(#op))),
            None => quote!(::core::option::Option::None),
        };
        quote! {
            ::ccl::gpu::codegen::Field {
                offset: ::core::mem::offset_of!(Self, #member),
                size: ::core::mem::size_of::<#ty>(),
                ty: <#ty as ::ccl::Reduce>::cuda_type(defs)?,
                op: #op,
            }
        }
    });
    let reduce_impl = quote! {
        #(#assertions)*
        // SAFETY: every field is `Reduce` (the bounds below), so the struct is
        // plain data whose non-padding bytes are valid for any bit pattern.
        unsafe impl #impl_g ::ccl::Reduce for #name #ty_g where #(#preds,)* #(#field_bounds,)* {
            const NAME: &'static str = ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name));
            fn cuda_type(defs: &mut ::std::string::String) -> ::core::option::Option<::std::string::String> {
                let fields = [#(#cuda_fields,)*];
                let rust_name = ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name));
                let name = ::ccl::gpu::codegen::struct_name(rust_name, &fields);
                let (size, align) = (::core::mem::size_of::<Self>(), ::core::mem::align_of::<Self>());
                ::ccl::gpu::codegen::define_struct(defs, &name, size, align, &fields);
                ::core::option::Option::Some(name)
            }
        }
    };

    let op_impls = FIELD_OPS.iter().map(|(_, op)| {
        let op = format_ident!("{}", op);
        let per_field = fields.iter().map(|(member, ty, pinned)| {
            let field_op = pinned.clone().unwrap_or_else(|| op.clone());
            let bound = quote!(for<'__ccl> ::ccl::#field_op: ::ccl::ReduceOp<#ty>);
            let value = quote! { #member: <::ccl::#field_op as ::ccl::ReduceOp<#ty>>::combine(a.#member, b.#member) };
            (bound, value)
        });
        let (bounds, values): (Vec<_>, Vec<_>) = per_field.unzip();
        quote! {
            impl #impl_g ::ccl::ReduceOp<#name #ty_g> for ::ccl::#op
            where #(#preds,)* for<'__ccl> #name #ty_g: ::ccl::Reduce, #(#bounds,)*
            {
                #[inline]
                fn combine(a: #name #ty_g, b: #name #ty_g) -> #name #ty_g {
                    #name { #(#values,)* }
                }
            }
        }
    });

    Ok(quote! {
        const _: () = {
            #reduce_impl
            #(#op_impls)*
        };
    })
}
