//! TCP between hosts (and between ranks of one host with
//! `CCL_SHM_DISABLE=1`).
//!
//! A connection is `CCL_SOCKETS_PER_PEER` sockets; message `m` travels on
//! socket `m mod k` as a frame (a header, then the payload: `frame`), so
//! consecutive slots move in parallel and arrive in order. Both ends keep
//! their own ring of slots: the sender stages a slot there and writes it
//! out as the socket accepts bytes; the receiver reads frames ahead into
//! free slots and hands them out in message order. Sockets are
//! non-blocking and driven by the progress engine; idle ranks `poll()` them.
//!
//! Each socket opens with a hello naming the connection, authenticated
//! by an HMAC of the job secret over the hello and a fresh nonce; a socket
//! whose hello does not verify is dropped and logged with its address
//! (`hello`). The sending end is [`TcpSend`], the receiving end [`TcpRecv`];
//! both keep their ring in `slots`.

mod frame;
mod hello;
mod notice;
mod recv;
mod send;
mod slots;

pub use recv::TcpRecv;
pub use send::TcpSend;

use super::doorbell::Doorbell;
use super::{ConnKey, Geometry, RecvConn, SendConn, Transport};
use crate::error::{Error, Result};
use slots::Slots;
use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// A connection as a receiver knows it: (communicator, sender, channel).
type Link = (u64, usize, u32);

/// Sockets accepted and authenticated, waiting for their receiver.
type Inbox = HashMap<Link, Vec<Option<TcpStream>>>;

/// Whether poll() should watch a socket, and for what.
struct SockFlag {
    fd: RawFd,
    /// For reading: a receiver's socket, or a sender's awaiting its
    /// acknowledgement.
    want_read: AtomicBool,
    want_write: AtomicBool,
}

/// What the transport's connections share: the listeners (one on each
/// of the rank's interfaces), the secret, sockets accepted but not yet
/// claimed, and what to poll.
struct Shared {
    me: usize,
    secret: [u8; 16],
    listeners: Vec<TcpListener>,
    nsocks: usize,
    inbox: Mutex<Inbox>,
    polled: Mutex<Vec<Weak<SockFlag>>>,
    /// Receiving connections still waiting for their sockets: while there
    /// are any, the listeners are worth polling.
    unclaimed: AtomicUsize,
    /// Accepted sockets whose hello has not fully arrived: source, when
    /// accepted, and bytes so far. Read without blocking, so a
    /// silent connection never stalls the rank.
    pending: Mutex<Vec<hello::Unhello>>,
    /// Nonces of the hellos accepted so far: a hello seen once is refused
    /// if it comes again (a replay), so a recorded hello admits no one.
    seen: Mutex<std::collections::HashSet<[u8; 16]>>,
    /// What peers on other hosts told of their last calls ([`notice`]).
    told: Mutex<notice::Told>,
}

/// Seconds idle before the first keepalive probe, between probes, and
/// unanswered probes before the kernel declares the link dead (~16 s).
const KEEPALIVE: (i32, i32, i32) = (10, 2, 3);

/// The local address this host uses to reach `to`: found by connecting a
/// UDP socket, which only looks up the route and sends nothing.
pub fn route_source(to: std::net::SocketAddr) -> std::io::Result<std::net::IpAddr> {
    let unspecified: std::net::SocketAddr =
        if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let u = std::net::UdpSocket::bind(unspecified)?;
    u.connect(to)?;
    Ok(u.local_addr()?.ip())
}

/// Turns on TCP keepalive with `KEEPALIVE` (probes after 10 s idle, every
/// 2 s, 3 unanswered: ~16 s), so that a peer host whose link goes down
/// turns into a socket error instead of a silent wait (also used by cclrun
/// for its SSH sessions).
///
/// Deliberately not `TCP_USER_TIMEOUT`: it would also end a connection
/// whose receiver is only busy: a sender whose peer computes longer than
/// the bound before its next call, with a full window and its probes
/// answered, fails with "timed out", and the job with it.
pub fn keepalive(s: &TcpStream) -> std::io::Result<()> {
    let fd = s.as_raw_fd();
    let set = |level: i32, opt: i32, v: i32| -> std::io::Result<()> {
        // SAFETY: `fd` is an open socket owned by `s`; the option value is a
        // live c_int whose size we pass.
        let r = unsafe {
            libc::setsockopt(fd, level, opt, &v as *const i32 as *const libc::c_void, std::mem::size_of::<i32>() as u32)
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE.0)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE.1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE.2)
}

/// A transport error saying what failed (`what`) and why.
fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::transport(format!("tcp {what}: {e}"))
}

impl Shared {
    /// Registers `stream` with what the idle rank polls: for reading
    /// (`read`), or for writing while its queue is not empty.
    fn watch(&self, stream: &TcpStream, read: bool) -> Arc<SockFlag> {
        let f = Arc::new(SockFlag {
            fd: stream.as_raw_fd(),
            want_read: AtomicBool::new(read),
            want_write: AtomicBool::new(false),
        });
        if let Ok(mut p) = self.polled.lock() {
            p.retain(|w| w.strong_count() > 0);
            p.push(Arc::downgrade(&f));
        }
        f
    }

    /// The `nsocks` sockets of `key` once they have all arrived.
    fn claim(&self, key: Link) -> Option<Vec<TcpStream>> {
        self.accept();
        let mut inbox = self.inbox.lock().ok()?;
        if inbox.get(&key)?.iter().all(Option::is_some) {
            return inbox.remove(&key).map(|v| v.into_iter().flatten().collect());
        }
        None
    }
}

/// The TCP transport of one process.
pub struct Tcp {
    shared: Arc<Shared>,
    checksum: bool,
    /// The interfaces this endpoint listens on, by name, in order.
    names: Vec<String>,
    /// Where every endpoint listens: one address per interface, named.
    peers: Vec<Vec<(String, SocketAddr)>>,
    /// Every endpoint's host as the errors name it: its address.
    hosts: Arc<[String]>,
    bell: Doorbell,
    /// (peer, communicator, latest call) told so far ([`notice`]).
    told_to: Mutex<std::collections::HashSet<(usize, u64, u64)>>,
    /// How long a connection to a peer is tried ([`Tcp::patience`]).
    patience: Duration,
}

/// What a sending end needs to open (and, when its peer's listener pushed
/// it out before reading its hello, open again) socket `idx` of its
/// connection.
struct Dial {
    addr: SocketAddr,
    key: ConnKey,
    shared: Arc<Shared>,
    /// How long to keep trying to connect ([`Tcp::patience`]).
    patience: Duration,
}

/// How long one try to connect waits for the peer's listener to take it.
const CONNECT_TRY: Duration = Duration::from_secs(2);

impl Dial {
    /// Socket `idx`, connected, its hello sent, non-blocking and watched
    /// for its acknowledgement ([`hello::ACK`]). A listener whose queue is
    /// full (a flood of connections to it) takes nothing for a while: the
    /// connection is tried again, this rank accepting its own meanwhile,
    /// until [`Tcp::patience`] runs out; one refused has no listener
    /// behind it.
    fn connect(&self, idx: usize) -> Result<(TcpStream, Arc<SockFlag>)> {
        let addr = self.addr;
        let start = std::time::Instant::now();
        let mut tries = 0;
        let mut s = loop {
            tries += 1;
            match TcpStream::connect_timeout(&addr, CONNECT_TRY) {
                Ok(s) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut && start.elapsed() < self.patience => {
                    // the peer may be waiting to connect to this rank too
                    self.shared.accept();
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(Error::transport(format!(
                        "tcp connect to {addr}: its listener took none of {tries} tries in {:.0} s (its queue full, \
                         as under a flood of connections to it)",
                        start.elapsed().as_secs_f64()
                    )))
                }
                Err(e) => return Err(io_err(&format!("connect to {addr}"), e)),
            }
        };
        let _ = s.set_nodelay(true);
        keepalive(&s).map_err(|e| io_err("keepalive", e))?;
        s.write_all(&self.shared.hello(self.key, idx)?).map_err(|e| io_err("hello", e))?;
        s.set_nonblocking(true).map_err(|e| io_err("connect", e))?;
        let flag = self.shared.watch(&s, true);
        Ok((s, flag))
    }
}

/// Endpoint `r`'s host in `hosts`, for an error that names it lost.
fn host_of(hosts: &[String], r: usize) -> String {
    hosts.get(r).cloned().unwrap_or_else(|| "tcp".into())
}

impl Tcp {
    /// Listens on `ip` (port chosen by the OS); the listener's address.
    pub fn listen(ip: std::net::IpAddr) -> Result<TcpListener> {
        let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| io_err("listen", e))?;
        l.set_nonblocking(true).map_err(|e| io_err("listen", e))?;
        super::admit::deepen_backlog(&l);
        Ok(l)
    }

    /// [`Tcp::on_interfaces`] on one unnamed interface, its peers each at
    /// one address.
    #[cfg(test)]
    pub fn new(
        me: usize,
        secret: [u8; 16],
        listener: TcpListener,
        peers: Vec<SocketAddr>,
        nsocks: usize,
        checksum: bool,
    ) -> Self {
        let peers = peers.into_iter().map(|a| vec![(String::new(), a)]).collect();
        Tcp::on_interfaces(me, secret, vec![(String::new(), listener)], peers, nsocks, checksum)
    }

    /// The transport of endpoint `me`, listening on one interface or
    /// several (`listeners`, named, in the order `CCL_SOCKET_IFNAME` names
    /// them), its peers on theirs (`peers`), with `nsocks` sockets per
    /// connection; `checksum` adds a CRC32 to every payload it sends. Each
    /// connection's ring of slots is cut as its group asks when it
    /// connects. Channel `c`'s connection to a peer goes to the `c`-th
    /// (modulo their count) of this endpoint's interfaces that the peer
    /// listens on too, so the channels spread over the interfaces both
    /// have.
    pub fn on_interfaces(
        me: usize,
        secret: [u8; 16],
        listeners: Vec<(String, TcpListener)>,
        peers: Vec<Vec<(String, SocketAddr)>>,
        nsocks: usize,
        checksum: bool,
    ) -> Self {
        let (names, listeners) = listeners.into_iter().unzip();
        let shared = Shared {
            me,
            secret,
            listeners,
            nsocks: nsocks.max(1),
            inbox: Mutex::new(HashMap::new()),
            polled: Mutex::new(Vec::new()),
            unclaimed: AtomicUsize::new(0),
            pending: Mutex::new(Vec::new()),
            seen: Mutex::new(std::collections::HashSet::new()),
            told: Mutex::default(),
        };
        let hosts = peers.iter().map(|a| a.first().map_or_else(|| "tcp".into(), |a| a.1.ip().to_string())).collect();
        let shared = Arc::new(shared);
        Shared::accept_in_background(&shared);
        let patience = crate::config::Config::default().timeout;
        Tcp { shared, checksum, names, peers, hosts, bell: Doorbell::new(), told_to: Mutex::default(), patience }
    }

    /// Where channel `channel`'s connection to `to` goes: the peer's
    /// address on the `channel`-th (modulo their count) of this endpoint's
    /// interfaces the peer has too, or its first address where they share
    /// none.
    fn peer_addr(&self, to: usize, channel: usize) -> Option<SocketAddr> {
        let addrs = self.peers.get(to)?;
        let both: Vec<SocketAddr> =
            self.names.iter().filter_map(|n| addrs.iter().find(|(m, _)| m == n).map(|&(_, a)| a)).collect();
        match both.len() {
            0 => addrs.first().map(|&(_, a)| a),
            k => Some(both[channel % k]),
        }
    }

    /// How long a connection to a peer is tried before it fails (the
    /// group's `CCL_TIMEOUT`; its default until set).
    pub fn patience(mut self, d: Duration) -> Self {
        self.patience = d;
        self
    }
}

impl Transport for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn can_connect(&self, from: usize, to: usize) -> bool {
        from < self.peers.len() && to < self.peers.len()
    }

    fn connect_send(&self, key: ConnKey, ring: Geometry) -> Result<SendConn> {
        let addr = self.peer_addr(key.to, key.channel as usize).ok_or_else(|| Error::internal("peer address"))?;
        let dial = Dial { addr, key, shared: Arc::clone(&self.shared), patience: self.patience };
        let socks = (0..self.shared.nsocks).map(|idx| dial.connect(idx)).collect::<Result<Vec<_>>>()?;
        let slots = Slots::new(ring)?;
        Ok(TcpSend::new(Arc::clone(&self.hosts), self.checksum, dial, socks, slots).into())
    }

    fn connect_recv(&self, key: ConnKey, ring: Geometry) -> Result<RecvConn> {
        let slots = Slots::new(ring)?;
        self.shared.unclaimed.fetch_add(1, Ordering::Relaxed);
        let link = (key.comm, key.from, key.channel);
        Ok(TcpRecv::new(link, Arc::clone(&self.hosts), Arc::clone(&self.shared), slots).into())
    }

    fn bell(&self) -> &Doorbell {
        &self.bell
    }

    fn check_alive(&self, _peers: &[usize]) -> Result<()> {
        Ok(())
    }

    fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        if self.shared.unclaimed.load(Ordering::Relaxed) > 0 {
            for l in &self.shared.listeners {
                out.push(libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            }
        }
        if let Ok(p) = self.shared.polled.lock() {
            for f in p.iter().filter_map(Weak::upgrade) {
                let events = if f.want_read.load(Ordering::Relaxed) {
                    libc::POLLIN
                } else if f.want_write.load(Ordering::Relaxed) {
                    libc::POLLOUT
                } else {
                    continue;
                };
                out.push(libc::pollfd { fd: f.fd, events, revents: 0 });
            }
        }
    }

    fn uses_bell(&self) -> bool {
        false
    }

    fn peer_call(&self, peer: usize, comm: u64, seq: u64) -> Option<super::call_board::Words> {
        self.shared.told(peer, comm, seq)
    }

    fn tell_calls(&self, peer: usize, comm: u64, calls: &[super::call_board::Words]) -> Result<()> {
        self.tell(peer, comm, calls)
    }
}

/// The IPv4 address of network interface `name`, if it has one, and
/// whether the interface is up and running (its link has a carrier).
pub fn interface_ipv4(name: &str) -> Option<(std::net::Ipv4Addr, bool)> {
    let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifs` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = ifs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if !ifa.ifa_addr.is_null() && n.to_bytes() == name.as_bytes() {
            // SAFETY: a non-null address whose family we check before reading it as sockaddr_in.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if fam == libc::AF_INET {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let up = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_uint;
                let running = ifa.ifa_flags & up == up;
                found = Some((std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)), running));
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list from getifaddrs, once.
    unsafe { libc::freeifaddrs(ifs) };
    found
}

#[cfg(test)]
mod tests {
    use super::frame::{header, HAS_CRC, HEADER};
    use super::hello::HELLO;
    use super::*;
    use crate::transport::{RecvVerbs, SendVerbs};
    use crate::error::ErrorKind;
    use std::time::Instant;

    fn transport(me: usize, checksum: bool) -> Tcp {
        let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
        Tcp::new(me, [9; 16], l, Vec::new(), 1, checksum)
    }

    /// Rank 0's transport, which reaches rank 1 (both endpoints) at the
    /// second one returned: rank 1's, listening on loopback.
    fn pair(checksum: bool) -> (Tcp, Tcp) {
        let rx = transport(1, checksum);
        let rx_addr = rx.shared.listeners[0].local_addr().expect("addr");
        let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
        (Tcp::new(0, [9; 16], l, vec![rx_addr; 2], 1, checksum), rx)
    }

    /// Polls `r` until it yields a slot or an error.
    fn next(r: &mut RecvConn) -> Result<Vec<u8>> {
        next_at(r).map(|(_, v)| v)
    }

    /// Polls `r` until it yields a message (where it lies, and its bytes)
    /// or an error.
    fn next_at(r: &mut RecvConn) -> Result<(*const u8, Vec<u8>)> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Some((p, len, _)) = r.peek()? {
                // SAFETY: a peeked message of `len` bytes, ours until released.
                let v = unsafe { std::slice::from_raw_parts(p, len) }.to_vec();
                r.release();
                return Ok((p, v));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(Error::transport("nothing arrived"))
    }

    /// Sends `frames` through `tx` to `r`, polling both, and returns what arrived.
    fn relay(tx: &mut SendConn, r: &mut RecvConn, frames: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        let mut got = Vec::new();
        let t = Instant::now();
        let mut sent = 0;
        while got.len() < frames.len() && t.elapsed() < Duration::from_secs(10) {
            if sent < frames.len() {
                if let Some(p) = tx.reserve(frames[sent].len(), false)? {
                    // SAFETY: a reserved slot of at least the frame's bytes (the caller cuts it so).
                    unsafe { std::ptr::copy_nonoverlapping(frames[sent].as_ptr(), p, frames[sent].len()) };
                    tx.post(frames[sent].len(), &[0; 4]);
                    sent += 1;
                }
            }
            tx.flush()?;
            if let Some((p, len, _)) = r.peek()? {
                // SAFETY: a peeked slot of `len` bytes, ours until released.
                got.push(unsafe { std::slice::from_raw_parts(p, len) }.to_vec());
                r.release();
            }
        }
        Ok(got)
    }

    #[test]
    fn channels_spread_over_the_interfaces_a_peer_listens_on() {
        // rank 1 listens on two loopback addresses, as on two interfaces:
        // channel c goes to its address c mod 2, and either carries data
        let (a, b) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let named = |l: TcpListener, n: &str| (n.to_string(), l);
        let listeners = vec![named(Tcp::listen(a).expect("listen"), "a"), named(Tcp::listen(b).expect("listen"), "b")];
        let at: Vec<(String, SocketAddr)> = listeners.iter().map(|(n, l)| (n.clone(), l.local_addr().expect("addr"))).collect();
        let rx = Tcp::on_interfaces(1, [9; 16], listeners, vec![Vec::new(), at.clone()], 1, false);
        let mine = vec![named(Tcp::listen(a).expect("listen"), "a"), named(Tcp::listen(b).expect("listen"), "b")];
        let tx = Tcp::on_interfaces(0, [9; 16], mine, vec![Vec::new(), at.clone()], 1, false);
        let ring = Geometry { nslots: 2, slot_bytes: 1024 };
        for channel in 0..4 {
            let key = ConnKey { comm: 7, from: 0, to: 1, channel };
            let mut s = tx.connect_send(key, ring).expect("send");
            let mut r = rx.connect_recv(key, ring).expect("recv");
            let frames: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i ^ channel as u8; 1024]).collect();
            assert_eq!(relay(&mut s, &mut r, &frames).expect("relayed"), frames, "channel {channel}");
        }
        // where the second address has no listener, odd channels cannot
        // connect and even ones still do
        let gone = Tcp::listen(b).expect("listen").local_addr().expect("addr");
        let mine = vec![named(Tcp::listen(a).expect("listen"), "a"), named(Tcp::listen(b).expect("listen"), "b")];
        let peers = vec![Vec::new(), vec![at[0].clone(), ("b".to_string(), gone)]];
        let tx = Tcp::on_interfaces(0, [9; 16], mine, peers, 1, false).patience(Duration::from_secs(1));
        let key = |channel| ConnKey { comm: 8, from: 0, to: 1, channel };
        assert!(tx.connect_send(key(0), ring).is_ok());
        match tx.connect_send(key(1), ring) {
            Ok(_) => panic!("no listener at the second address, yet connected"),
            Err(e) => assert!(e.to_string().contains(&gone.to_string()), "{e}"),
        }
        // an interface the peer does not listen on is not used for it: a
        // sender on `b` alone, or on `c` and `a`, reaches a peer on `a` alone
        let peers = vec![Vec::new(), vec![at[0].clone()]];
        for names in [vec!["b"], vec!["c", "a"]] {
            let mine = names.iter().map(|n| named(Tcp::listen(a).expect("listen"), n)).collect();
            let tx = Tcp::on_interfaces(0, [9; 16], mine, peers.clone(), 1, false);
            for channel in 0..3 {
                assert_eq!(tx.peer_addr(1, channel), Some(at[0].1), "{names:?}, channel {channel}");
            }
        }
    }

    #[test]
    fn each_connection_cuts_its_ring_as_its_group_asks() {
        let (tx, rx) = pair(false);
        // two slots, rounded up to whole cache lines, carry more frames than there are slots, in order
        let ring = Geometry { nslots: 2, slot_bytes: 1000 };
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        assert_eq!((s.slot_bytes(), r.slot_bytes()), (1024, 1024));
        let frames: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i.wrapping_mul(37); 1024]).collect();
        assert_eq!(relay(&mut s, &mut r, &frames).expect("relayed"), frames);
        // a connection of another group, cut smaller, on the same transports
        let key = ConnKey { channel: 1, ..key };
        let small = Geometry { nslots: 32, slot_bytes: 64 };
        let mut s = tx.connect_send(key, small).expect("send");
        let mut r = rx.connect_recv(key, small).expect("recv");
        assert_eq!((s.slot_bytes(), r.slot_bytes()), (64, 64));
        let frames: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 64]).collect();
        assert_eq!(relay(&mut s, &mut r, &frames).expect("relayed"), frames);
        // a sender cut larger than its receiver: the oversized frame is an error, not an overrun
        let key = ConnKey { channel: 2, ..key };
        let mut s = tx.connect_send(key, ring).expect("send");
        let mut r = rx.connect_recv(key, small).expect("recv");
        let e = relay(&mut s, &mut r, &[vec![1; 1024]]).expect_err("oversized frame");
        assert_eq!(e.to_string(), "transport: frame of 1024 bytes exceeds a slot of 64");
    }

    #[test]
    fn a_sender_pushed_out_before_its_hello_was_read_connects_again_and_waits_for_its_ack() {
        // a listener standing for a flooded rank's: it drops the first
        // connection unread, as a flood of newer strangers would push it out
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let at = l.local_addr().expect("addr");
        let tx = Tcp::new(0, [9; 16], Tcp::listen([127, 0, 0, 1].into()).expect("listen"), vec![at; 2], 1, false);
        let ring = Geometry { nslots: 2, slot_bytes: 1024 };
        let mut s = tx.connect_send(ConnKey { comm: 3, from: 0, to: 1, channel: 0 }, ring).expect("send");
        let accept = |s: &mut SendConn, what: &str| {
            let t = Instant::now();
            loop {
                let _ = s.flush();
                match l.accept() {
                    Ok((c, _)) => return c,
                    Err(_) if t.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => panic!("{what}: {e}"),
                }
            }
        };
        drop(accept(&mut s, "the first connection"));
        let p = s.reserve(8, false).expect("reserve").expect("a free slot");
        // SAFETY: a reserved slot of at least 8 bytes.
        unsafe { std::ptr::copy_nonoverlapping([5u8; 8].as_ptr(), p, 8) };
        s.post(8, &[0; 4]);
        use std::io::Read;
        let mut c = accept(&mut s, "the connection opened again");
        c.set_nonblocking(false).expect("blocking");
        c.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
        let mut hello = vec![0u8; HELLO];
        c.read_exact(&mut hello).expect("a fresh hello");
        let mut more = [0u8; 1];
        s.flush().expect("nothing to write yet");
        assert!(c.read(&mut more).is_err(), "data before the acknowledgement");
        c.write_all(&[hello::ACK]).expect("ack");
        c.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut frame = [0u8; HEADER + 8];
        let t = Instant::now();
        let mut got = 0;
        while got < frame.len() && t.elapsed() < Duration::from_secs(10) {
            s.flush().expect("flush");
            c.set_nonblocking(true).expect("nonblocking");
            match c.read(&mut frame[got..]) {
                Ok(n) => got += n,
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert_eq!(&frame[HEADER..], &[5u8; 8], "the message, once acknowledged");
    }

    #[test]
    fn idle_strangers_cannot_fill_the_listener_of_a_rank_between_calls() {
        let (tx, rx) = pair(false);
        let addr = rx.shared.listeners[0].local_addr().expect("addr");
        // more idle connections than the listener's backlog holds, while
        // rank 1 is in no call
        let idle: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(addr).ok()).collect();
        assert!(idle.len() > 128, "the backlog took {}", idle.len());
        std::thread::sleep(Duration::from_millis(500));
        let waiting = rx.shared.pending.lock().expect("pending").len();
        assert!(waiting <= 128, "{waiting} strangers kept from one address");
        // a later connection (a split) still gets through, and its data
        let ring = Geometry { nslots: 2, slot_bytes: 1024 };
        let key = ConnKey { comm: 8, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        assert_eq!(relay(&mut s, &mut r, &[vec![3; 8]]).expect("relayed"), vec![vec![3; 8]]);
        drop(idle);
    }

    #[test]
    fn a_peer_on_another_host_is_told_this_rank_s_last_calls() {
        let (tx, rx) = pair(false);
        let calls = [[11, 12, 13, 5], [21, 22, 23, 6]];
        tx.tell_calls(1, 7, &calls).expect("told");
        let t = Instant::now();
        while rx.peer_call(0, 7, 6).is_none() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(rx.peer_call(0, 7, 6), Some(calls[1]));
        assert_eq!(rx.peer_call(0, 7, 5), Some(calls[0]));
        assert_eq!(rx.peer_call(0, 8, 5), None, "another communicator's call");
        assert_eq!(rx.peer_call(1, 7, 5), None, "told by rank 0, not rank 1");
        // told once per latest call: a second telling opens nothing
        tx.tell_calls(1, 7, &calls).expect("nothing to tell");
        assert_eq!(tx.told_to.lock().expect("told").len(), 1);
    }

    #[test]
    fn a_relayed_loss_names_the_lost_rank_s_host() {
        // rank 0 tells rank 1 it fails because rank 2 (at 192.0.2.7) is gone
        let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
        let rx_addr = l.local_addr().expect("addr");
        let far: SocketAddr = "192.0.2.7:4000".parse().expect("address");
        let rx = Tcp::new(1, [9; 16], l, vec![rx_addr, rx_addr, far], 1, false);
        let tx = Tcp::new(0, [9; 16], Tcp::listen([127, 0, 0, 1].into()).expect("listen"), vec![rx_addr; 3], 1, false);
        let ring = Geometry { nslots: 2, slot_bytes: 1024 };
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        assert_eq!(relay(&mut s, &mut r, &[vec![1; 8]]).expect("relayed"), vec![vec![1; 8]]);
        s.announce_lost(2);
        let e = next(&mut r).expect_err("the notice");
        assert!(e.to_string().starts_with("lost rank 2 on 192.0.2.7: reported by rank 0"), "{e}");
    }

    #[test]
    fn lent_memory_goes_out_as_it_is_and_a_failing_call_takes_it_back() {
        let (tx, rx) = pair(false);
        let ring = Geometry { nslots: 2, slot_bytes: 1024 };
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        assert!(s.offers().lends);
        // lent memory arrives like a slot, in order with slots
        let a: Vec<u8> = (0..1000).map(|i| i as u8).collect();
        // SAFETY: `a` outlives the frame, which is written before `lent` is 0 (checked below).
        unsafe { s.lend(a.as_ptr(), a.len(), &[0; 4], false) }.expect("tcp lends");
        let b = vec![5u8; 1024];
        assert_eq!(relay(&mut s, &mut r, std::slice::from_ref(&b)).expect("relayed"), vec![a]);
        assert_eq!(next(&mut r).expect("slot frame"), b);
        assert_eq!(s.lent(), 0);
        // more than the sockets hold, never read: still lent; taken back,
        // the stream is cut mid-frame and this end fails
        let big = vec![3u8; 64 << 20];
        // SAFETY: `big` outlives the frame until `forget_lent` below.
        unsafe { s.lend(big.as_ptr(), big.len(), &[0; 4], false) }.expect("tcp lends");
        s.flush().expect("no error yet");
        assert_eq!(s.lent(), 1);
        s.forget_lent();
        assert_eq!(s.lent(), 0);
        drop(big);
        let e = s.flush().expect_err("cut mid-frame");
        assert!(e.to_string().contains("cut off mid-frame"), "{e}");
    }

    #[test]
    fn held_lent_memory_taken_back_is_sent_as_it_was() {
        let (tx, rx) = pair(true);
        let ring = Geometry { nslots: 2, slot_bytes: 1 << 20 };
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        let t = Instant::now();
        let reserve = |s: &mut SendConn| {
            while s.reserve(1 << 20, false).expect("reserve").is_none() && t.elapsed() < Duration::from_secs(10) {}
        };
        // more than the sockets hold, not read yet: the frames after it wait in the queue
        let big: Vec<u8> = (0..64 << 20).map(|i: u32| (i % 251) as u8).collect();
        for part in big.chunks(1 << 20) {
            reserve(&mut s);
            // SAFETY: `big` outlives its frames, which are all read below.
            unsafe { s.lend(part.as_ptr(), part.len(), &[0; 4], false) }.expect("lend");
        }
        assert!(s.lent() > 2, "64 MiB is more than the sockets hold");
        let mut held: Vec<Vec<u8>> = (0..2u8).map(|i| vec![i + 1; 1 << 20]).collect();
        for f in &held {
            reserve(&mut s);
            // SAFETY: `held` outlives its frames: sent or taken back below.
            unsafe { s.lend(f.as_ptr(), f.len(), &[0; 4], true) }.expect("lend");
        }
        assert!(s.reserve(1 << 20, false).expect("reserve").is_none(), "held frames keep their slots");
        // take back the second held frame (tens of MiB behind the first
        // unsent byte), part of which is about to be overwritten
        let before = s.lent();
        // SAFETY: a pointer inside `held[1]`.
        s.reclaim(unsafe { held[1].as_ptr().add(1000) }, 10);
        assert_eq!(s.lent(), before - 1, "one frame taken back");
        held[1].fill(0xEE);
        let mut got = Vec::new();
        while got.len() < 66 && t.elapsed() < Duration::from_secs(20) {
            s.flush().expect("flush");
            if let Some((p, len, _)) = r.peek().expect("peek") {
                // SAFETY: a peeked slot of `len` bytes, ours until released.
                got.push(unsafe { std::slice::from_raw_parts(p, len) }.to_vec());
                r.release();
            }
        }
        assert_eq!(got.len(), 66);
        assert_eq!(s.lent(), 0);
        assert!(got[..64].concat() == big && got[64] == vec![1; 1 << 20], "lent frames arrive as they were");
        assert_eq!(got[65], vec![2; 1 << 20], "the frame taken back arrives as it was when lent");
    }

    #[test]
    fn sockets_get_keepalive() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let s = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        keepalive(&s).expect("keepalive");
        let get = |level: i32, opt: i32| {
            let mut v: i32 = 0;
            let mut len = std::mem::size_of::<i32>() as u32;
            // SAFETY: reading an int option of an open socket into a live int.
            let r = unsafe {
                libc::getsockopt(s.as_raw_fd(), level, opt, &mut v as *mut i32 as *mut libc::c_void, &mut len)
            };
            assert_eq!(r, 0);
            v
        };
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), KEEPALIVE.0);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT), KEEPALIVE.2);
    }

    #[test]
    fn checksums_catch_corrupted_payloads_and_bad_hellos_are_dropped() {
        let rx = transport(1, true);
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let mut r = rx.connect_recv(key, Geometry { nslots: 4, slot_bytes: 256 }).expect("recv end");
        let addr = rx.shared.listeners[0].local_addr().expect("addr");
        // a stranger with the wrong secret is dropped; the real sender is accepted
        let mut stranger = TcpStream::connect(addr).expect("connect");
        stranger.write_all(&[0u8; HELLO]).expect("garbage hello");
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(&rx.shared.hello(key, 0).expect("hello")).expect("hello");
        let payload = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let good = u64::from(crc32fast::hash(&payload)) | HAS_CRC;
        s.write_all(&header(8, &[1, 2, 3, 4], good)).and_then(|()| s.write_all(&payload)).expect("frame");
        assert_eq!(next(&mut r).expect("intact frame"), payload);
        // the same payload with one bit flipped on the way
        let mut flipped = payload;
        flipped[3] ^= 0x10;
        s.write_all(&header(8, &[1, 2, 3, 4], good)).and_then(|()| s.write_all(&flipped)).expect("frame");
        let e = next(&mut r).expect_err("corruption detected");
        assert!(matches!(e.kind(), ErrorKind::Corrupt { .. }), "{e}");
        assert_eq!(e.to_string(), "corrupted data on the tcp from rank 0 channel 0 link: payload checksum mismatch");
    }

    #[test]
    fn messages_are_read_into_places_given_before_their_payload_starts() {
        let rx = transport(1, true);
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let mut r = rx.connect_recv(key, Geometry { nslots: 4, slot_bytes: 256 }).expect("recv end");
        assert!(r.offers().lands);
        let mut s = TcpStream::connect(rx.shared.listeners[0].local_addr().expect("addr")).expect("connect");
        s.write_all(&rx.shared.hello(key, 0).expect("hello")).expect("hello");
        let head = |p: &[u8]| header(p.len(), &[1, 2, 3, 4], u64::from(crc32fast::hash(p)) | HAS_CRC);
        let mut places = vec![[0u8; 64]; 5];
        let at: Vec<*mut u8> = places.iter_mut().map(|p| p.as_mut_ptr()).collect();
        // reads until `bytes` of the frame in progress are in
        let read_to = |r: &mut RecvConn, bytes: usize| {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                assert!(r.peek().expect("peek").is_none());
                if matches!(r, RecvConn::Tcp(t) if t.read_so_far() == bytes) {
                    return;
                }
            }
            panic!("{bytes} B of the frame never arrived");
        };
        let pattern: Vec<u8> = (0..64).collect();
        // (every place given below: `places` outlives `r`'s use of it and is
        // only read once its message has been released or the place withdrawn)
        // message 0 is given a place before it is sent: it is read there;
        // message 1 does not fit its place: it goes into a slot
        // SAFETY: see above, on `places`.
        unsafe { r.post_into(0, at[0], 64) };
        // SAFETY: see above, on `places`.
        unsafe { r.post_into(1, at[1], 16) };
        for p in [&[7u8; 64][..], &[8; 32]] {
            s.write_all(&head(p)).and_then(|()| s.write_all(p)).expect("frame");
        }
        assert_eq!(next_at(&mut r).expect("message 0"), (at[0] as *const u8, vec![7; 64]));
        let (p, got) = next_at(&mut r).expect("message 1");
        assert!(!std::ptr::eq(p, at[1]) && got == [8; 32]);
        // message 2's header is in, not its payload, when it gets a place: read there
        s.write_all(&head(&pattern)).expect("header");
        read_to(&mut r, HEADER);
        // SAFETY: see above, on `places`.
        unsafe { r.post_into(0, at[2], 64) };
        s.write_all(&pattern).expect("payload");
        assert_eq!(next_at(&mut r).expect("message 2"), (at[2] as *const u8, pattern.clone()));
        // message 3's payload has begun when it gets a place: the slot
        s.write_all(&head(&pattern)).and_then(|()| s.write_all(&pattern[..10])).expect("part");
        read_to(&mut r, HEADER + 10);
        // SAFETY: see above, on `places`.
        unsafe { r.post_into(0, at[3], 64) };
        s.write_all(&pattern[10..]).expect("rest");
        let (p, got) = next_at(&mut r).expect("message 3");
        assert!(!std::ptr::eq(p, at[3]) && got == pattern);
        // message 4's place is withdrawn mid-payload: what was read moves
        // into the slot, the rest follows there
        // SAFETY: see above, on `places`.
        unsafe { r.post_into(0, at[4], 64) };
        s.write_all(&head(&pattern)).and_then(|()| s.write_all(&pattern[..20])).expect("part");
        read_to(&mut r, HEADER + 20);
        r.withdraw();
        s.write_all(&pattern[20..]).expect("rest");
        let (p, got) = next_at(&mut r).expect("message 4");
        assert!(!std::ptr::eq(p, at[4]) && got == pattern);
        assert_eq!(places[1], [0; 64], "a message too large for its place leaves it alone");
        assert_eq!(places[3], [0; 64], "a message begun in a slot stays there");
        assert!(places[4][..20] == pattern[..20] && places[4][20..] == [0; 44], "nothing read after the withdrawal");
    }

    #[test]
    fn only_fresh_hellos_with_the_secret_get_in() {
        let rx = transport(1, false);
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let addr = rx.shared.listeners[0].local_addr().expect("addr");
        let real = rx.shared.hello(key, 0).expect("hello");
        let mut forged = real.clone();
        forged[20] ^= 1; // addressed to another rank, tag unchanged
        let other = Tcp::new(0, [8; 16], Tcp::listen([127, 0, 0, 1].into()).expect("listen"), Vec::new(), 1, false);
        let intruders: [&[u8]; 5] = [
            &real[..HELLO / 2],                          // truncated, then closed
            &[0xff; HELLO],                              // random bytes
            &forged,                                     // altered after signing
            &other.shared.hello(key, 0).expect("hello"), // another job's secret
            &[],                                         // connects and says nothing
        ];
        for bytes in intruders {
            let mut s = TcpStream::connect(addr).expect("connect");
            let _ = s.write_all(bytes);
        }
        // one that connects and stays silent: waited for without blocking anyone
        let _silent = TcpStream::connect(addr).expect("connect");
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(&real).expect("hello");
        // a recording of the accepted hello, replayed on a new connection
        let mut replay = TcpStream::connect(addr).expect("connect");
        replay.write_all(&real).expect("replay");
        let t = Instant::now();
        while rx.shared.inbox.lock().expect("inbox").is_empty() && t.elapsed() < Duration::from_secs(20) {
            rx.shared.accept();
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        rx.shared.accept();
        let inbox = rx.shared.inbox.lock().expect("inbox");
        assert_eq!(inbox.len(), 1, "only the real connection is kept");
        assert_eq!(inbox.values().next().map(|v| v.iter().flatten().count()), Some(1));
        assert_eq!(rx.shared.seen.lock().expect("seen").len(), 1);
        assert_eq!(rx.shared.pending.lock().expect("pending").len(), 1, "the silent one still has time");
    }
}
