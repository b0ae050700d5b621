//! The CUDA kernels (`cuda/collectives.cu`), compiled at run time with
//! NVRTC through cudarc (feature `cuda`), for one architecture at a time.
//!
//! NVRTC is loaded dynamically: a build with this feature needs no CUDA
//! install, and a machine without `libnvrtc` gets an error, never a panic
//! (the library is probed before cudarc touches it). The headers for f16
//! and bf16 (`cuda_fp16.h`, `cuda_bf16.h`) come from `CCL_CUDA_INCLUDE`,
//! else `$CUDA_HOME/include`, else `/usr/local/cuda/include`. What the
//! driver loads (`image`) is CUBIN for the device's architecture, so the
//! driver's PTX version does not matter; PTX only where NVRTC gives no
//! CUBIN. Compiled code is kept per architecture and source for the life
//! of the process.
//!
//! The sources, kernel names and the code generation for derived structs
//! ([`codegen`]) need no feature; compiling them does (feature `cuda`).

pub mod codegen;

#[cfg(feature = "cuda")]
use std::collections::HashMap;
#[cfg(feature = "cuda")]
use std::sync::Mutex;

/// The CUDA C source of every kernel.
pub const SOURCE: &str = include_str!("../../cuda/collectives.cu");

/// Element types with kernels, by their CUDA name.
pub const TYPES: [&str; 12] = ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f32", "f64", "f16", "bf16"];

/// Operators with kernels; the bitwise ones only for integers.
pub const OPS: [&str; 7] = ["Sum", "Prod", "Min", "Max", "BitAnd", "BitOr", "BitXor"];

/// Marks where the primitive types' kernels start: a derived type's source
/// is everything before it, then its own definitions.
pub const PRIMITIVES_MARK: &str = "// ---- the primitive types";

/// Every kernel's name (the PTX entry points).
pub fn kernel_names() -> Vec<String> {
    let mut v = vec!["ccl_wait_flag".to_string(), "ccl_set_flag".to_string()];
    for t in TYPES {
        v.push(format!("ccl_copy_{t}"));
        v.push(format!("ccl_div_{t}"));
        let int = !t.starts_with('f') && t != "bf16";
        for op in OPS.iter().filter(|o| int || !o.starts_with("Bit")) {
            v.push(format!("ccl_reduce_{op}_{t}"));
            v.push(format!("ccl_recv_reduce_send_{op}_{t}"));
        }
    }
    v
}

#[cfg(feature = "cuda")]
/// Library names tried for NVRTC, newest first.
const NVRTC: [&str; 4] = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"];

#[cfg(feature = "cuda")]
/// Whether NVRTC can be loaded here (`LD_LIBRARY_PATH` and the usual places).
pub fn nvrtc_available() -> bool {
    loadable(&NVRTC)
}

#[cfg(feature = "cuda")]
/// Whether the CUDA driver (`libcuda.so.1`) can be loaded here.
pub fn driver_available() -> bool {
    loadable(&["libcuda.so.1", "libcuda.so"])
}

#[cfg(feature = "cuda")]
/// Whether any of `names` can be dlopened.
fn loadable(names: &[&str]) -> bool {
    names.iter().any(|name| {
        let c = std::ffi::CString::new(*name).unwrap_or_default();
        // SAFETY: dlopen with a valid C string; the handle is closed again.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if h.is_null() {
                false
            } else {
                libc::dlclose(h);
                true
            }
        }
    })
}

#[cfg(feature = "cuda")]
/// Where the CUDA headers are.
pub fn include_dir() -> Option<String> {
    let candidates = [
        std::env::var("CCL_CUDA_INCLUDE").ok(),
        std::env::var("CUDA_HOME").ok().map(|h| format!("{h}/include")),
        Some("/usr/local/cuda/include".to_string()),
    ];
    candidates.into_iter().flatten().find(|d| std::path::Path::new(d).join("cuda_fp16.h").exists())
}

#[cfg(feature = "cuda")]
static CACHE: Mutex<Option<HashMap<(&'static str, String), String>>> = Mutex::new(None);

/// Code the driver loads (`cuModuleLoadData` takes either).
#[cfg(feature = "cuda")]
#[derive(Clone, Debug)]
pub enum Image {
    /// Machine code for one architecture (an ELF image).
    Cubin(Vec<u8>),
    /// PTX text, NUL-terminated, which the driver compiles.
    Ptx(std::ffi::CString),
}

#[cfg(feature = "cuda")]
impl Image {
    /// The bytes to hand to `cuModuleLoadData`.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Image::Cubin(b) => b,
            Image::Ptx(c) => c.as_bytes_with_nul(),
        }
    }
}

#[cfg(feature = "cuda")]
static IMAGES: Mutex<Option<HashMap<(&'static str, String), Image>>> = Mutex::new(None);

/// The code of `source` for `arch` that the driver loads: CUBIN, compiled
/// by NVRTC for that architecture; PTX ([`compile`]) where NVRTC gives no
/// CUBIN (a virtual architecture).
#[cfg(feature = "cuda")]
pub fn image(source: &str, arch: &'static str) -> Result<Image, String> {
    let key = (arch, source.to_string());
    if let Some(i) = IMAGES.lock().ok().and_then(|c| c.as_ref().and_then(|m| m.get(&key).cloned())) {
        return Ok(i);
    }
    let image = match cubin(source, arch)? {
        Some(bin) => Image::Cubin(bin),
        None => Image::Ptx(std::ffi::CString::new(compile(source, arch)?).map_err(|_| "PTX with a NUL byte")?),
    };
    if let Ok(mut c) = IMAGES.lock() {
        c.get_or_insert_with(HashMap::new).insert(key, image.clone());
    }
    Ok(image)
}

/// CUBIN of `source` for `arch` through NVRTC's C API (cudarc's safe
/// wrapper returns PTX only); `None` where NVRTC made none.
#[cfg(feature = "cuda")]
fn cubin(source: &str, arch: &'static str) -> Result<Option<Vec<u8>>, String> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_available() {
        return Err("NVRTC (libnvrtc) is not installed or not on LD_LIBRARY_PATH".into());
    }
    let include = include_dir()
        .ok_or("cuda_fp16.h not found: set CCL_CUDA_INCLUDE (or CUDA_HOME) to the CUDA include directory")?;
    let src = std::ffi::CString::new(source).map_err(|_| "kernel source with a NUL byte")?;
    let prog = result::create_program(&src, None).map_err(|e| format!("NVRTC for {arch}: {e:?}"))?;
    let options =
        [format!("--gpu-architecture={arch}"), format!("--include-path={include}"), "--std=c++14".to_string()];
    // SAFETY: a program created above, destroyed once below; the buffers
    // passed to NVRTC are as large as it says.
    unsafe {
        let r = result::compile_program(prog, &options).map_err(|e| {
            let log = result::get_program_log(prog).unwrap_or_default();
            let log: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            format!("NVRTC for {arch}: {e:?}: {}", String::from_utf8_lossy(&log))
        });
        let mut size = 0usize;
        let bin = r.map(|()| {
            if sys::nvrtcGetCUBINSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                return None;
            }
            let mut bin = vec![0u8; size];
            let got = sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr() as *mut std::ffi::c_char);
            (got == sys::nvrtcResult::NVRTC_SUCCESS).then_some(bin)
        });
        let _ = result::destroy_program(prog);
        bin
    }
}

/// PTX of every primitive type's kernels for `arch` (`"sm_80"`, `"sm_90"`, ...).
#[cfg(feature = "cuda")]
pub fn ptx(arch: &'static str) -> Result<String, String> {
    compile(SOURCE, arch)
}

/// PTX of `source` (this file's [`SOURCE`] or a derived type's from
/// [`codegen::source`]) for `arch`.
#[cfg(feature = "cuda")]
pub fn compile(source: &str, arch: &'static str) -> Result<String, String> {
    let key = (arch, source.to_string());
    if let Some(p) = CACHE.lock().ok().and_then(|c| c.as_ref().and_then(|m| m.get(&key).cloned())) {
        return Ok(p);
    }
    if !nvrtc_available() {
        return Err("NVRTC (libnvrtc) is not installed or not on LD_LIBRARY_PATH".into());
    }
    let include = include_dir()
        .ok_or("cuda_fp16.h not found: set CCL_CUDA_INCLUDE (or CUDA_HOME) to the CUDA include directory")?;
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        include_paths: vec![include],
        options: vec!["--std=c++14".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| format!("NVRTC for {arch}: {e:?}"))?;
    let text = ptx.to_src();
    if let Ok(mut c) = CACHE.lock() {
        c.get_or_insert_with(HashMap::new).insert(key, text.clone());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_named_in_the_source() {
        let names = kernel_names();
        assert_eq!(names.len(), 2 + 8 * 16 + 4 * 10);
        assert!(SOURCE.contains("CCL_INT(i16)") && SOURCE.contains("CCL_ARITH(bf16)"));
    }

    /// Whether NVRTC and the CUDA headers are here (scripts/deps.sh cuda
    /// puts them in .cache/cuda); a test without them skips, unless
    /// CCL_TEST_REQUIRE_ALL=1.
    #[cfg(feature = "cuda")]
    fn nvrtc_here() -> bool {
        if nvrtc_available() && include_dir().is_some() {
            return true;
        }
        assert!(std::env::var("CCL_TEST_REQUIRE_ALL").as_deref() != Ok("1"), "NVRTC or CUDA headers missing");
        eprintln!("SKIPPED: NVRTC or the CUDA headers are missing");
        false
    }

    #[cfg(feature = "cuda")]
    /// What the driver gets is CUBIN for the architecture.
    #[test]
    fn kernels_compile_to_cubin_for_sm80_and_sm90() {
        if !nvrtc_here() {
            return;
        }
        for arch in ["sm_80", "sm_90"] {
            let Image::Cubin(bin) = image(SOURCE, arch).unwrap_or_else(|e| panic!("{e}")) else {
                panic!("{arch}: PTX, not CUBIN");
            };
            assert_eq!(&bin[..4], b"\x7fELF", "{arch}");
            for k in kernel_names() {
                assert!(
                    bin.windows(k.len() + 1).any(|w| &w[..k.len()] == k.as_bytes() && w[k.len()] == 0),
                    "{arch}: {k}"
                );
            }
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn kernels_compile_to_ptx_for_sm80_and_sm90() {
        if !nvrtc_here() {
            return;
        }
        for arch in ["sm_80", "sm_90"] {
            let ptx = ptx(arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx.contains(&format!(".target {arch}")), "{arch}");
            for k in kernel_names() {
                assert!(ptx.contains(&format!(".entry {k}(")), "{arch}: {k} missing");
            }
        }
    }
}
