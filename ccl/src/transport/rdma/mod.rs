//! RDMA between hosts: reliable-connected queue pairs that write slots
//! straight into the receiver's registered memory.
//!
//! A connection is one queue pair per direction and channel, or several
//! that its messages are dealt to in turn (`CCL_IB_QPS_PER_CONNECTION`). The
//! receiver's slots are registered memory; the sender stages a message in
//! a registered slot of its own and writes it, with its call's fingerprint
//! after it, into the receiver's slot of the same number with one write
//! with immediate (the immediate: the message's sequence number, so a late
//! or duplicated write is an error). The receiver keeps one receive posted
//! per slot and returns freed slots with small writes into the sender's
//! credit word, half a ring at once ([`recv`]). Completions are polled by
//! the progress engine, which sleeps on the completion channels'
//! descriptors when idle ([`Transport::poll_fds`]).
//!
//! The two ends meet over a TCP pair of their own, authenticated as every
//! TCP connection of the job is (`setup`): queue pairs, addresses and
//! rkeys never travel in the clear. The verbs come from a provider
//! ([`verbs`]): the software one ([`soft`], `CCL_IB_SOFT=1`), or
//! libibverbs, loaded at run time (`ibv`, feature `rdma`).

#[cfg(feature = "rdma")]
pub mod ibv;
pub mod mem;
mod qps;
pub mod recv;
pub mod send;
mod setup;
pub mod soft;
mod spans;
pub mod verbs;

pub use recv::RdmaRecv;
pub use send::RdmaSend;

use super::doorbell::Doorbell;
use super::tcp::Tcp;
use super::{ConnKey, Geometry, RecvConn, SendConn, Transport};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use verbs::{Device, LinkLayer, QpInfo, Status};

/// Bytes of the fingerprint after every message.
const FP: usize = 32;
/// Credit writes a receiver may have in flight, beside a sender's slots.
const EXTRA_DEPTH: usize = 16;
/// Slots per connection at least: the group cuts few for sockets, which
/// the kernel buffers; here the ring is all there is, and more slots let
/// credits come back in batches.
const MIN_SLOTS: usize = 8;

/// A completion channel's descriptor, polled while its connection lives.
pub(super) struct Watch {
    fd: RawFd,
}

/// One of the process's RDMA ports, and the caller's memory registered
/// with it for sending straight from there.
struct Port {
    dev: Arc<dyn Device>,
    name: String,
    spans: Arc<spans::Spans>,
}

/// What the transport's connections share.
struct Shared {
    me: usize,
    /// The ports its connections spread over, channel `c` on port `c`
    /// modulo their count; all of one link layer.
    ports: Vec<Port>,
    link: LinkLayer,
    /// Every endpoint's host, as errors name it.
    hosts: Arc<[String]>,
    info: bool,
    watched: Mutex<Vec<Weak<Watch>>>,
}

/// One connection's view of the transport: its peer, its port, and what
/// it shares.
pub(super) struct Link {
    peer: usize,
    /// Its port, of `shared.ports`.
    port: usize,
    shared: Arc<Shared>,
}

impl Link {
    /// Its port's device.
    fn dev(&self) -> &Arc<dyn Device> {
        &self.shared.ports[self.port].dev
    }

    /// What is registered with its port for sending straight from there.
    fn spans(&self) -> &spans::Spans {
        &self.shared.ports[self.port].spans
    }

    fn dev_name(&self) -> &str {
        &self.shared.ports[self.port].name
    }

    /// Polls `fd` while the returned watch lives.
    fn watch(&self, fd: RawFd) -> Arc<Watch> {
        let w = Arc::new(Watch { fd });
        if let Ok(mut v) = self.shared.watched.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(Arc::downgrade(&w));
        }
        w
    }

    fn host(&self) -> String {
        self.shared.hosts.get(self.peer).cloned().unwrap_or_else(|| "rdma".into())
    }

    /// The error a failed completion is: a peer that stopped answering is lost.
    fn failed(&self, st: Status) -> Error {
        let dev = self.dev_name();
        match st {
            Status::RetryExceeded => Error::new(ErrorKind::PeerLost {
                rank: self.peer,
                host: self.host(),
                why: format!("rdma on {dev}: {}", st.describe()),
            }),
            _ => Error::transport(format!("rdma on {dev} with rank {} ({}): {}", self.peer, self.host(), st.describe())),
        }
        .with_peer(self.peer)
    }

    /// `Err` where the peer's port cannot reach this one's.
    fn check_peer(&self, q: &QpInfo) -> Result<()> {
        if q.link != self.shared.link {
            return Err(Error::transport(format!(
                "rdma: rank {} uses a {:?} port, this rank {:?} ({}): set CCL_IB_HCA to ports of one link layer, or \
                 CCL_IB_DISABLE=1",
                self.peer,
                q.link,
                self.shared.link,
                self.dev_name()
            )));
        }
        Ok(())
    }

    /// Says, at INFO, that the `dir` end to the peer is connected.
    fn connected(&self, dir: &str) {
        if self.shared.info {
            eprintln!("ccl INFO rank {} {dir} rank {}: rdma {}", self.shared.me, self.peer, self.dev_name());
        }
    }
}

/// The RDMA transport of one process: its device, and the TCP transport
/// its connections meet over.
pub struct Rdma {
    shared: Arc<Shared>,
    tcp: Arc<Tcp>,
    /// Every endpoint's RDMA port's link layer (none: it has none).
    ports: Vec<Option<LinkLayer>>,
    /// Queue pairs per connection.
    qps: usize,
    bell: Doorbell,
}

/// The devices `config` picks for rank `rank`, whose TCP transport listens
/// on `ips`, or why there is none: every active port `CCL_IB_HCA` allows
/// (the first of each device), or the software provider's, one on each
/// of `ips`.
pub fn open(config: &Config, ips: &[std::net::IpAddr], rank: usize) -> std::result::Result<Vec<Arc<dyn Device>>, String> {
    if config.ib_disable {
        return Err("CCL_IB_DISABLE=1".into());
    }
    if config.ib_soft {
        let retry = config.timeout.min(Duration::from_secs(8));
        let fault = config.ib_soft_fault.filter(|f| f.rank == rank);
        let one = |ip: &std::net::IpAddr| {
            soft::SoftDevice::open(*ip, retry, fault).map(|d| Arc::new(d) as Arc<dyn Device>).map_err(|e| e.to_string())
        };
        return ips.iter().map(one).collect();
    }
    #[cfg(feature = "rdma")]
    return ibv::open(&config.ib_hca, config.ib_gid_index)
        .map(|v| v.into_iter().map(|d| Arc::new(d) as Arc<dyn Device>).collect());
    #[cfg(not(feature = "rdma"))]
    Err("no RDMA provider: built without feature `rdma` (CCL_IB_SOFT=1 uses the software one)".into())
}

impl Rdma {
    /// The transport of endpoint `me` over `devs` (channel `c` on device
    /// `c` modulo their count; those of another link layer than the first
    /// are left out), meeting peers over `tcp`; `hosts` names every
    /// endpoint's host, `ports` its RDMA ports' link layer (none: the
    /// transport does not connect it).
    pub fn new(
        me: usize,
        devs: Vec<Arc<dyn Device>>,
        tcp: Arc<Tcp>,
        hosts: Arc<[String]>,
        ports: Vec<Option<LinkLayer>>,
        info: bool,
    ) -> Result<Self> {
        let link = devs.first().ok_or_else(|| Error::internal("rdma without a device"))?.link_layer();
        let (mine, other): (Vec<_>, Vec<_>) = devs.into_iter().partition(|d| d.link_layer() == link);
        if info && !other.is_empty() {
            let names: Vec<String> = other.iter().map(|d| d.name()).collect();
            eprintln!("ccl INFO rank {me}: rdma: left out {} (another link layer than {link:?})", names.join(", "));
        }
        let ports_here: Vec<Port> =
            mine.into_iter().map(|dev| Port { name: dev.name(), dev, spans: Arc::default() }).collect();
        let dev_name = ports_here.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
        if info {
            let gdr = if std::path::Path::new("/sys/module/nvidia_peermem").exists() {
                "nvidia-peermem is loaded, but device memory is not registered yet"
            } else {
                "nvidia-peermem is not loaded"
            };
            eprintln!("ccl INFO rank {me}: rdma {dev_name}: GPU buffers are staged through host memory ({gdr})");
        }
        if info {
            let other: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|&(r, p)| r != me && *p != Some(link))
                .map(|(r, p)| format!("{r} ({})", p.map_or("no RDMA port", |_| "another link layer")))
                .collect();
            if !other.is_empty() {
                eprintln!("ccl INFO rank {me}: TCP, not RDMA, to ranks {}", other.join(", "));
            }
        }
        let shared = Arc::new(Shared { me, ports: ports_here, link, hosts, info, watched: Mutex::default() });
        Ok(Rdma { shared, tcp, ports, qps: 1, bell: Doorbell::new() })
    }

    /// Spreads each connection over `k` queue pairs (1 ..= 16).
    pub fn queue_pairs(mut self, k: usize) -> Self {
        self.qps = k.clamp(1, setup::MAX_QPS);
        self
    }

    /// Channel `channel`'s connection with `peer`, on its port.
    fn link(&self, peer: usize, channel: u32) -> Link {
        let port = channel as usize % self.shared.ports.len();
        Link { peer, port, shared: Arc::clone(&self.shared) }
    }
}

impl Transport for Rdma {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn can_connect(&self, from: usize, to: usize) -> bool {
        let port = |r: usize| self.ports.get(r).copied().flatten();
        self.tcp.can_connect(from, to) && port(from).is_some() && port(from) == port(to)
    }

    fn connect_send(&self, key: ConnKey, ring: Geometry) -> Result<SendConn> {
        let setup = setup::Setup::open(&self.tcp, key, true)?;
        let (link, nslots) = (self.link(key.to, key.channel), ring.nslots.max(MIN_SLOTS));
        let qps = qps::Qps::new(&link, self.qps, nslots.div_ceil(self.qps) + EXTRA_DEPTH)?;
        Ok(RdmaSend::new(link, qps, setup, nslots, ring.slot_bytes)?.into())
    }

    fn connect_recv(&self, key: ConnKey, ring: Geometry) -> Result<RecvConn> {
        let setup = setup::Setup::open(&self.tcp, key, false)?;
        let (link, nslots) = (self.link(key.from, key.channel), ring.nslots.max(MIN_SLOTS));
        let qps = qps::Qps::new(&link, self.qps, nslots.div_ceil(self.qps) + EXTRA_DEPTH)?;
        Ok(RdmaRecv::new(link, qps, setup, nslots, ring.slot_bytes)?.into())
    }

    fn bell(&self) -> &Doorbell {
        &self.bell
    }

    fn check_alive(&self, _peers: &[usize]) -> Result<()> {
        Ok(())
    }

    fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        if let Ok(v) = self.shared.watched.lock() {
            out.extend(v.iter().filter_map(Weak::upgrade).map(|w| libc::pollfd { fd: w.fd, events: libc::POLLIN, revents: 0 }));
        }
    }

    fn uses_bell(&self) -> bool {
        false
    }

    unsafe fn register(&self, p: *mut u8, len: usize) -> Result<Option<super::Registration>> {
        // one span on each port, its connections' messages lent from there
        let mut spans = Vec::with_capacity(self.shared.ports.len());
        for port in &self.shared.ports {
            // SAFETY: valid until the span drops (the caller's contract).
            spans.push(unsafe { spans::Span::new(&port.spans, &port.dev, p, len) }?);
        }
        Ok(Some(Box::new(spans)))
    }
}

#[cfg(test)]
mod tests;
