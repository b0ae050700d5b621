//! With feature `rdma`: the types of libibverbs (Debian: libibverbs-dev),
//! generated from its header. Only types: the library itself is loaded
//! at run time (transport/rdma/ibv), so a binary runs without it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "rdma")]
    verbs_types();
}

#[cfg(feature = "rdma")]
fn verbs_types() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ibv.rs");
    let b = bindgen::Builder::default()
        .header_contents("ibv.h", "#include <infiniband/verbs.h>\n")
        .allowlist_type("ibv_.*")
        .allowlist_type("ib_uverbs_access_flags")
        .allowlist_var("IBV_LINK_LAYER_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate();
    match b {
        Ok(b) => b.write_to_file(&out).expect("write the verbs types"),
        Err(e) => panic!(
            "feature `rdma` builds the verbs types from <infiniband/verbs.h>: install libibverbs-dev and libclang-dev \
             (scripts/deps.sh test): {e}"
        ),
    }
}
