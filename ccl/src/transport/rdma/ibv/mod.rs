//! The libibverbs provider (feature `rdma`): the library is loaded at run
//! time ([`sys`]), so a binary built with the feature starts where it is
//! absent, and finds no device there.
//!
//! A process opens the first active port its `CCL_IB_HCA` allows, and on
//! RoCE the GID `CCL_IB_GID_INDEX` names or the automatic choice
//! ([`select`]); each queue pair has a completion queue and channel of
//! its own.

mod qp;
pub mod select;
mod sys;

use super::verbs::{Device, LinkLayer, Mr, QueuePair};
use crate::error::{Error, Result};
use select::{choose_gid, Gid, HcaFilter};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

/// An opened device port, its protection domain, and the GID it is
/// addressed by.
pub(super) struct Port {
    lib: &'static sys::Lib,
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
    name: String,
    port: u8,
    lid: u16,
    gid: Gid,
    link: LinkLayer,
    mtu: u32,
}

// SAFETY: libibverbs' objects may be used from any thread (its calls are
// thread-safe); the pointers live until `Port` drops, after every queue
// pair and region (which hold an `Arc` of it).
unsafe impl Send for Port {}
// SAFETY: as above.
unsafe impl Sync for Port {}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the protection domain and context opened in `open`, no longer used.
        unsafe {
            (self.lib.dealloc_pd)(self.pd);
            (self.lib.close_device)(self.ctx);
        }
    }
}

/// A libibverbs device port.
pub struct IbvDevice {
    port: Arc<Port>,
    /// Registrations by rkey.
    mrs: Mutex<HashMap<u32, usize>>,
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// The ports `hca` and `gid_index` pick (the first active one of each
/// device it allows), opened; `Err` says why there is none.
pub fn open(hca: &str, gid_index: Option<usize>) -> std::result::Result<Vec<IbvDevice>, String> {
    let filter = HcaFilter::parse(hca).map_err(|e| format!("CCL_IB_HCA={hca:?}: {e}"))?;
    let lib = sys::lib()?;
    let mut n = 0;
    // SAFETY: fills `n`; the list is freed below.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() || n <= 0 {
        if !list.is_null() {
            // SAFETY: the list returned above.
            unsafe { (lib.free_device_list)(list) };
        }
        return Err("no RDMA device".into());
    }
    let mut seen = Vec::new();
    let (mut opened, mut failed) = (Vec::new(), String::new());
    for i in 0..n as usize {
        // SAFETY: `i` < n entries of the list.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a device of the list; its name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr((lib.get_device_name)(dev)) }.to_string_lossy().into_owned();
        seen.push(name.clone());
        match open_port(lib, dev, &name, &filter, gid_index) {
            Ok(Some(p)) => opened.push(IbvDevice { port: Arc::new(p), mrs: Mutex::default() }),
            Ok(None) => {}
            Err(e) => failed = e,
        }
    }
    // SAFETY: the list returned above; devices opened stay valid after it is freed.
    unsafe { (lib.free_device_list)(list) };
    match failed {
        _ if !opened.is_empty() => Ok(opened),
        e if !e.is_empty() => Err(e),
        _ if !hca.is_empty() => Err(format!("CCL_IB_HCA={hca:?} allows no active port (devices: {})", seen.join(", "))),
        _ => Err(format!("no active port (devices: {})", seen.join(", "))),
    }
}

/// The first active port of `dev` that `filter` allows, opened.
fn open_port(
    lib: &'static sys::Lib,
    dev: *mut sys::ibv_device,
    name: &str,
    filter: &HcaFilter,
    gid_index: Option<usize>,
) -> std::result::Result<Option<Port>, String> {
    // SAFETY: a device of the live list.
    let ctx = unsafe { (lib.open_device)(dev) };
    if ctx.is_null() {
        return Err(format!("{name}: cannot open it ({})", errno()));
    }
    let close = |why: String| {
        // SAFETY: the context opened above, not used after.
        unsafe { (lib.close_device)(ctx) };
        why
    };
    for port in 1..=u8::MAX {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: an open context; `attr` is a whole port attribute.
        if unsafe { (lib.query_port)(ctx, port, &mut attr) } != 0 {
            break; // past the last port
        }
        if attr.state != sys::IBV_PORT_ACTIVE || !filter.allows(name, port) {
            continue;
        }
        let link = if u32::from(attr.link_layer) == sys::IBV_LINK_LAYER_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::Infiniband
        };
        let table: Vec<Gid> = (0..attr.gid_tbl_len.max(0) as usize)
            .filter_map(|i| {
                let mut g = sys::ibv_gid::default();
                // SAFETY: an open context, a GID slot within the port's table.
                (unsafe { (lib.query_gid)(ctx, port, i as i32, &mut g) } == 0).then(|| Gid {
                    index: i,
                    // SAFETY: every byte pattern is a valid raw GID.
                    raw: unsafe { g.raw },
                    v2: roce_v2(name, port, i),
                })
            })
            .collect();
        let gid = match (link, gid_index) {
            (LinkLayer::Ethernet, _) | (_, Some(_)) => {
                choose_gid(&table, gid_index).map_err(|e| close(format!("{name}:{port}: {e}")))?
            }
            _ => table.first().copied().unwrap_or(Gid { index: 0, raw: [0; 16], v2: false }),
        };
        // SAFETY: an open context.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(close(format!("{name}: no protection domain ({})", errno())));
        }
        let mtu = attr.active_mtu;
        return Ok(Some(Port { lib, ctx, pd, name: name.into(), port, lid: attr.lid, gid, link, mtu }));
    }
    close(String::new());
    Ok(None)
}

/// Whether sysfs calls GID `index` of `dev`'s `port` RoCE v2.
fn roce_v2(dev: &str, port: u8, index: usize) -> bool {
    let at = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}");
    std::fs::read_to_string(at).is_ok_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2"))
}

impl Device for IbvDevice {
    fn name(&self) -> String {
        format!("{}:{}", self.port.name, self.port.port)
    }

    fn link_layer(&self) -> LinkLayer {
        self.port.link
    }

    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Mr> {
        let p = &self.port;
        let access = (sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE) as i32;
        // SAFETY: the caller keeps the memory valid until `deregister`.
        let mr = unsafe { (p.lib.reg_mr)(p.pd, addr.cast(), len, access) };
        if mr.is_null() {
            let e = errno();
            let hint = if matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM) | Some(libc::EAGAIN)) {
                ": the locked-memory limit is too low (ulimit -l unlimited, or LimitMEMLOCK=infinity for a service)"
            } else {
                ""
            };
            return Err(Error::transport(format!("rdma {}: registering {len} bytes failed ({e}){hint}", self.name())));
        }
        // SAFETY: a registration just made.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        if let Ok(mut m) = self.mrs.lock() {
            m.insert(rkey, mr as usize);
        }
        Ok(Mr { addr: addr as usize, len, lkey, rkey })
    }

    fn deregister(&self, mr: &Mr) {
        let raw = self.mrs.lock().ok().and_then(|mut m| m.remove(&mr.rkey));
        if let Some(raw) = raw {
            // SAFETY: a registration made by `register`, removed from the map: ended once.
            unsafe { (self.port.lib.dereg_mr)(raw as *mut sys::ibv_mr) };
        }
    }

    fn queue_pair(&self, depth: usize) -> Result<Box<dyn QueuePair>> {
        Ok(Box::new(qp::IbvQp::new(Arc::clone(&self.port), depth)?))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_machine_without_a_device_or_with_a_bad_hca_list_gets_a_reason_not_a_panic() {
        let e = super::open("mlx5_0:0", None).err().expect("a bad list");
        assert!(e.contains("CCL_IB_HCA"), "{e}");
        // here: no libibverbs, or no device, or (on a machine with RDMA) a port
        match super::open("", None) {
            Ok(v) => {
                assert!(!v.is_empty(), "opened no port, yet no reason");
                for d in &v {
                    println!("opened {}", crate::transport::rdma::verbs::Device::name(d));
                }
            }
            Err(e) => assert!(e.contains("libibverbs") || e.contains("no RDMA device") || e.contains("no active port"), "{e}"),
        }
    }
}
