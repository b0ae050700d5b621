//! libibverbs, loaded at run time: its types (generated from Debian's
//! libibverbs-dev header by build.rs) and the entry points the provider
//! calls, looked up once. The data path (post, poll, notify) goes through
//! the function table of each device context, as the header's inline
//! functions do.

/// The generated types.
#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, missing_docs)]
#[allow(clippy::all, clippy::undocumented_unsafe_blocks)]
mod types {
    include!(concat!(env!("OUT_DIR"), "/ibv.rs"));
}
pub use types::*;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// The entry points of libibverbs the provider uses.
pub struct Lib {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub get_cq_event: unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
}

/// libibverbs, loaded once: `Err` says why it is not there.
pub fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local message or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown".into()
    } else {
        // SAFETY: a NUL-terminated message owned by libdl.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

// each symbol's type is its field's in `Lib`
#[allow(clippy::missing_transmute_annotations)]
fn load() -> Result<Lib, String> {
    // SAFETY: a NUL-terminated name; the handle is kept for the process's life.
    let h = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!("libibverbs.so.1 is not there ({}): install rdma-core (libibverbs1)", dlerror()));
    }
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: a NUL-terminated name looked up in the handle opened above.
            let p = unsafe { libc::dlsym(h, concat!($name, "\0").as_ptr().cast()) };
            if p.is_null() {
                return Err(format!("libibverbs.so.1 lacks {}", $name));
            }
            // SAFETY: the symbol is libibverbs' function of that name, whose C signature
            // the field's type spells (verbs.h).
            unsafe { std::mem::transmute::<*mut c_void, _>(p) }
        }};
    }
    Ok(Lib {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        create_comp_channel: sym!("ibv_create_comp_channel"),
        destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        get_cq_event: sym!("ibv_get_cq_event"),
        ack_cq_events: sym!("ibv_ack_cq_events"),
    })
}
