//! A software verbs provider: queue pairs between processes over TCP,
//! held to what RDMA hardware enforces, so that the RDMA transport runs,
//! and is tested, where no device is (`CCL_IB_SOFT=1`).
//!
//! Each device listens on one address. A queue pair dials its peer's
//! device and proves, before anything else, the peer queue pair's number
//! and the token its [`QpInfo`](super::verbs::QpInfo) carried (which only the bootstrap's
//! authenticated connections carry); a connection that does not is
//! closed. Over it, the queue pair's requests (writes, with or without an
//! immediate) travel as frames and the peer answers each with a status,
//! in order.
//!
//! The rules kept: a write lands only inside a region registered with its
//! `rkey` (otherwise a remote access error); a local piece outside a
//! region registered with its `lkey` is a local protection error; a write
//! with immediate consumes one posted receive (none posted: receiver not
//! ready); one completion per signaled request, in order; a queue pair
//! that errs flushes every outstanding request with an error completion
//! and fails from then on; a peer that closes, or answers nothing for
//! the device's retry time, gives retry-exceeded errors. An aligned write of
//! 8 bytes lands whole, as a NIC's does.

mod qp;
#[cfg(test)]
mod tests;

use super::verbs::{Device, LinkLayer, Mr, QueuePair};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::net::{SocketAddr, TcpListener, TcpStream};
use crate::config::SoftFault;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

/// Bytes a connection sends first: magic, the queue pair it reaches and
/// that queue pair's token.
const INTRO: usize = 8 + 4 + 16;
const MAGIC: &[u8; 8] = b"cclsoft1";
/// How long a new connection may take to introduce itself.
const INTRO_WAIT: Duration = Duration::from_secs(2);
/// Connections being introduced at once; a newcomer beyond pushes out the oldest.
const INTRODUCING: usize = 64;

/// A registered region, alive until deregistered: a writer holds `live`
/// for reading while it writes, deregistration takes it for writing.
struct Region {
    addr: usize,
    len: usize,
    live: RwLock<bool>,
}

impl Region {
    /// Whether `[addr, addr + len)` lies inside.
    fn holds(&self, addr: u64, len: u64) -> bool {
        let start = self.addr as u64;
        addr >= start && addr.checked_add(len).is_some_and(|end| end <= start + self.len as u64)
    }
}

/// What a device's queue pairs and its listener share.
struct Dev {
    addr: SocketAddr,
    regions: RwLock<HashMap<u32, Arc<Region>>>,
    qps: Mutex<HashMap<u32, Weak<qp::Shared>>>,
    next_qpn: AtomicU32,
    retry: Duration,
    stop: AtomicBool,
    /// A fault to inject, and the writes posted so far (to find its write).
    fault: Option<SoftFault>,
    writes: AtomicU64,
}

impl Dev {
    /// The fault injected into the write now posted, if it is the one.
    fn fault_now(&self) -> Option<crate::config::SoftFaultKind> {
        let n = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        self.fault.filter(|f| f.at == n).map(|f| f.kind)
    }

    /// The live region registered with `key` that holds `len` bytes at `addr`.
    fn region(&self, key: u32, addr: u64, len: u64) -> Option<Arc<Region>> {
        let r = self.regions.read().ok()?.get(&key).cloned()?;
        r.holds(addr, len).then_some(r)
    }
}

/// A software device: one per transport.
pub struct SoftDevice {
    dev: Arc<Dev>,
}

impl SoftDevice {
    /// A device listening on `ip` (port chosen by the OS) whose queue
    /// pairs give up on a silent peer after `retry`, injecting `fault`
    /// (`CCL_IB_SOFT_FAULT`) when its write comes.
    pub fn open(ip: std::net::IpAddr, retry: Duration, fault: Option<SoftFault>) -> Result<Self> {
        let io = |e: std::io::Error| Error::transport(format!("soft rdma device on {ip}: {e}"));
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        crate::transport::admit::deepen_backlog(&listener);
        let dev = Arc::new(Dev {
            addr: listener.local_addr().map_err(io)?,
            regions: RwLock::default(),
            qps: Mutex::default(),
            next_qpn: AtomicU32::new(rand::random::<u32>() & 0xff_ffff),
            retry,
            stop: AtomicBool::new(false),
            fault,
            writes: AtomicU64::new(0),
        });
        let d = Arc::downgrade(&dev);
        std::thread::Builder::new()
            .name("ccl-soft-rdma".into())
            .spawn(move || accept(&listener, &d))
            .map_err(|e| Error::transport(format!("soft rdma device thread: {e}")))?;
        Ok(SoftDevice { dev })
    }

    /// The address its queue pairs are reached at.
    #[cfg(test)]
    fn addr(&self) -> SocketAddr {
        self.dev.addr
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.dev.stop.store(true, Ordering::Relaxed);
    }
}

impl Device for SoftDevice {
    fn name(&self) -> String {
        format!("soft:{}", self.dev.addr)
    }

    fn link_layer(&self) -> LinkLayer {
        LinkLayer::Ethernet
    }

    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<Mr> {
        let mut regions = self.dev.regions.write().map_err(|_| Error::internal("soft rdma regions poisoned"))?;
        let key = loop {
            let k = rand::random::<u32>();
            if k != 0 && !regions.contains_key(&k) {
                break k;
            }
        };
        regions.insert(key, Arc::new(Region { addr: addr as usize, len, live: RwLock::new(true) }));
        Ok(Mr { addr: addr as usize, len, lkey: key, rkey: key })
    }

    fn deregister(&self, mr: &Mr) {
        let r = self.dev.regions.write().ok().and_then(|mut m| m.remove(&mr.rkey));
        if let Some(r) = r {
            // waits for a write into it in progress
            if let Ok(mut live) = r.live.write() {
                *live = false;
            }
        }
    }

    fn queue_pair(&self, depth: usize) -> Result<Box<dyn QueuePair>> {
        let qpn = self.dev.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        let q = qp::SoftQp::new(&self.dev, qpn, depth)?;
        if let Ok(mut m) = self.dev.qps.lock() {
            m.retain(|_, w| w.strong_count() > 0);
            m.insert(qpn, Arc::downgrade(q.shared()));
        }
        Ok(Box::new(q))
    }
}

/// A connection accepted and not yet introduced: when, and its bytes so far.
struct Pending {
    stream: TcpStream,
    since: std::time::Instant,
    got: Vec<u8>,
}

/// Takes connections to the device until it is dropped, reading each
/// one's introduction without blocking: as it is accepted, and then
/// whenever it has more. At most `INTRODUCING` wait at once, the oldest
/// pushed out by a newcomer (after the closed and the introduced have left),
/// and none longer than `INTRO_WAIT`: a queue pair's own connection
/// introduces itself as it opens, so strangers that flood the listener
/// with idle or closing connections push out only each other.
fn accept(l: &TcpListener, dev: &Weak<Dev>) {
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let Some(d) = dev.upgrade() else { return };
        if d.stop.load(Ordering::Relaxed) {
            return;
        }
        while let Ok((s, _)) = l.accept() {
            if s.set_nonblocking(true).is_err() {
                continue;
            }
            let mut p = Pending { stream: s, since: std::time::Instant::now(), got: Vec::with_capacity(INTRO) };
            if !p.read(&d) {
                continue;
            }
            if pending.len() >= INTRODUCING {
                pending.retain_mut(|p| p.read(&d));
            }
            if pending.len() >= INTRODUCING {
                pending.remove(0); // the oldest
            }
            pending.push(p);
        }
        pending.retain_mut(|p| p.read(&d));
        drop(d);
        let mut fds: Vec<libc::pollfd> = std::iter::once(l.as_raw_fd())
            .chain(pending.iter().map(|p| p.stream.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd for the call's duration.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
    }
}

impl Pending {
    /// Reads what has come of the introduction, handing the connection on
    /// once it is whole; false when it no longer waits (introduced, closed,
    /// or silent too long).
    fn read(&mut self, d: &Dev) -> bool {
        let mut b = [0u8; INTRO];
        let want = INTRO - self.got.len();
        match self.stream.read(&mut b[..want]) {
            Ok(0) => false,
            Ok(n) => {
                self.got.extend_from_slice(&b[..n]);
                if self.got.len() < INTRO {
                    return true;
                }
                if let Ok(s) = self.stream.try_clone() {
                    introduce(s, &self.got, d);
                }
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.since.elapsed() < INTRO_WAIT,
            Err(_) => false,
        }
    }
}

/// Hands a connection whose introduction is `intro` to the queue pair it
/// proves it may reach; anything else closes it.
fn introduce(s: TcpStream, intro: &[u8], dev: &Dev) {
    if &intro[..8] != MAGIC || s.set_nonblocking(false).is_err() {
        return;
    }
    let qpn = u32::from_le_bytes(intro[8..12].try_into().unwrap_or_default());
    let token: [u8; 16] = intro[12..].try_into().unwrap_or_default();
    let q = dev.qps.lock().ok().and_then(|m| m.get(&qpn).and_then(Weak::upgrade));
    if let Some(q) = q {
        q.attach_incoming(s, &token);
    }
}
