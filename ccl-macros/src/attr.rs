//! The `#[reduce(...)]` field attribute.

use syn::spanned::Spanned;

/// The operators a field can be pinned to.
pub const FIELD_OPS: [(&str, &str); 4] = [("sum", "Sum"), ("prod", "Prod"), ("min", "Min"), ("max", "Max")];

/// Reads a field's `#[reduce(op)]`, if any: the name of the ccl operator
/// type it pins the field to. Errors name the allowed spellings.
pub fn field_override(field: &syn::Field) -> syn::Result<Option<syn::Ident>> {
    let mut found: Option<syn::Ident> = None;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("reduce")) {
        let list = attr.meta.require_list().map_err(|_| {
            syn::Error::new(
                attr.span(),
                "expected `#[reduce(sum)]`, `#[reduce(prod)]`, `#[reduce(min)]` or `#[reduce(max)]`",
            )
        })?;
        let ident: syn::Ident = syn::parse2(list.tokens.clone())
            .map_err(|_| syn::Error::new(list.tokens.span(), "expected one operator: `sum`, `prod`, `min` or `max`"))?;
        let Some((_, ty)) = FIELD_OPS.iter().find(|(name, _)| ident == name) else {
            return Err(syn::Error::new(
                ident.span(),
                format!("unknown reduction `{ident}` for a field: use `sum`, `prod`, `min` or `max`"),
            ));
        };
        if found.is_some() {
            return Err(syn::Error::new(attr.span(), "a field takes at most one `#[reduce(...)]`"));
        }
        found = Some(syn::Ident::new(ty, ident.span()));
    }
    Ok(found)
}
