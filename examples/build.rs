//! With feature `gloo`, compiles ccl-perf's C interface to Gloo
//! (`src/bin/ccl-perf/gloo.cc`) and links Debian's libgloo.

fn main() {
    #[cfg(feature = "gloo")]
    {
        let src = "src/bin/ccl-perf/gloo.cc";
        println!("cargo:rerun-if-changed={src}");
        cc::Build::new().cpp(true).std("c++17").file(src).warnings(true).compile("ccl_perf_gloo");
        println!("cargo:rustc-link-lib=gloo");
    }
}
