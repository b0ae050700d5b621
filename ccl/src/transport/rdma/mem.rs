//! Memory this process registers with its device: allocated page-aligned
//! and zeroed, registered for local use and remote writes, deregistered
//! before it is freed.

use super::verbs::{Device, Mr};
use crate::error::{Error, Result};
use std::alloc::Layout;
use std::sync::Arc;

/// A registered allocation.
pub(super) struct Registered {
    ptr: *mut u8,
    layout: Layout,
    mr: Mr,
    dev: Arc<dyn Device>,
}

// SAFETY: the allocation is owned by this value; whoever shares its
// pointer (a queue pair writing into it) does so under the verbs' rules.
unsafe impl Send for Registered {}

impl Registered {
    /// `len` zeroed bytes registered with `dev`.
    pub(super) fn new(dev: &Arc<dyn Device>, len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(64), 4096).map_err(|e| Error::internal(e.to_string()))?;
        // SAFETY: a layout of non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::transport(format!("rdma: no memory for {len} bytes of slots")));
        }
        // SAFETY: the allocation lives until drop, which deregisters it first.
        match unsafe { dev.register(ptr, layout.size()) } {
            Ok(mr) => Ok(Registered { ptr, layout, mr, dev: Arc::clone(dev) }),
            Err(e) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }

    /// Its first byte.
    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its registration.
    pub(super) fn mr(&self) -> &Mr {
        &self.mr
    }

    /// Bytes.
    pub(super) fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.dev.deregister(&self.mr);
        // SAFETY: allocated in `new` with `layout`; no write reaches it once deregistered.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}
