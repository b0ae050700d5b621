//! TCP between hosts (and between ranks of one host with
//! `CCL_SHM_DISABLE=1`).
//!
//! A connection is `CCL_SOCKETS_PER_PEER` sockets; message `m` travels on
//! socket `m mod k` as a frame `[u32 length][payload]`, so consecutive
//! slots move in parallel and arrive in order. Both ends keep their own
//! ring of slots: the sender stages a slot there and writes it out as the
//! socket accepts bytes; the receiver reads frames ahead into free slots
//! and hands them out in message order. Sockets are non-blocking and
//! driven by the progress engine; idle ranks `poll()` them.
//!
//! Each socket opens with a hello naming the connection, authenticated
//! by an HMAC of the job secret over the hello and a fresh nonce; a socket
//! whose hello does not verify is dropped and logged with its address.

use super::doorbell::Doorbell;
use super::{ConnKey, Geometry, RecvConn, SendConn, Transport};
use crate::error::{Error, ErrorKind, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind as IoKind, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"CCLT";
/// Frame header: payload length (u32), the call's fingerprint (4 × u64),
/// and a checksum word: bit 32 set when the low 32 bits hold the payload's
/// CRC32 (`CCL_CHECKSUM=1` on the sender).
const HEADER: usize = 4 + 32 + 8;
const HAS_CRC: u64 = 1 << 32;
/// First fingerprint word of a sender's last frame saying it is failing
/// because the endpoint in the second word is gone.
const LOST: u64 = u64::MAX;

fn header(len: usize, fp: &[u64; 4], check: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&(len as u32).to_le_bytes());
    for (i, w) in fp.iter().chain([&check]).enumerate() {
        h[4 + 8 * i..12 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    h
}

fn parse_header(h: &[u8; HEADER]) -> (usize, [u64; 4], u64) {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let word = |i: usize| u64::from_le_bytes(h[4 + 8 * i..12 + 8 * i].try_into().unwrap_or([0; 8]));
    (len, [word(0), word(1), word(2), word(3)], word(4))
}
const HELLO: usize = 4 + 8 + 8 + 8 + 4 + 4 + 4 + 16 + 32;

/// A connection as a receiver knows it: (communicator, sender, channel).
type Link = (u64, usize, u32);

/// Sockets accepted and authenticated, waiting for their receiver.
type Inbox = HashMap<Link, Vec<Option<TcpStream>>>;

/// Whether poll() should watch a socket, and for what.
struct SockFlag {
    fd: RawFd,
    read: bool,
    want_write: AtomicBool,
}

/// What the transport's connections share: the listener, the secret,
/// sockets accepted but not yet claimed, and what to poll.
struct Shared {
    me: usize,
    secret: [u8; 16],
    listener: TcpListener,
    nsocks: usize,
    inbox: Mutex<Inbox>,
    polled: Mutex<Vec<Weak<SockFlag>>>,
    /// Receiving connections still waiting for their sockets: while there
    /// are any, the listener is worth polling.
    unclaimed: AtomicUsize,
    /// Accepted sockets whose hello has not fully arrived: bytes so far,
    /// source, and when to give up on them. Read without blocking, so a
    /// silent connection never stalls the rank.
    pending: Mutex<Vec<Unhello>>,
    /// Nonces of the hellos accepted so far: a hello seen once is refused
    /// if it comes again (a replay), so a recorded hello admits no one.
    seen: Mutex<std::collections::HashSet<[u8; 16]>>,
}

/// An accepted socket waiting for its hello: source, deadline, bytes so far.
type Unhello = (TcpStream, std::net::SocketAddr, Instant, Vec<u8>);

/// How long an accepted connection has to send its hello.
const HELLO_WITHIN: Duration = Duration::from_secs(5);

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

/// Turns on TCP keepalive with [`KEEPALIVE`], so that a peer host whose
/// link goes down turns into a socket error instead of a silent wait
/// (also used by cclrun for its SSH sessions).
///
/// Deliberately not `TCP_USER_TIMEOUT`: it would also end a connection
/// whose receiver is only busy. Measured on this machine's kernel (6.18,
/// loopback), with 16 s set, a sender whose peer did not read for 17 s
/// (a full window, its probes answered) failed with "timed out" — a rank
/// computing longer than that before its next call would end the job.
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

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::transport(format!("tcp {what}: {e}"))
}

fn mac(secret: &[u8], bytes: &[u8]) -> Result<[u8; 32]> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Error::internal("hmac key"))?;
    m.update(b"ccl-tcp");
    m.update(bytes);
    Ok(m.finalize().into_bytes().into())
}

impl Shared {
    fn watch(&self, stream: &TcpStream, read: bool) -> Arc<SockFlag> {
        let f = Arc::new(SockFlag { fd: stream.as_raw_fd(), read, want_write: AtomicBool::new(false) });
        if let Ok(mut p) = self.polled.lock() {
            p.retain(|w| w.strong_count() > 0);
            p.push(Arc::downgrade(&f));
        }
        f
    }

    fn hello(&self, key: ConnKey, idx: usize) -> Result<Vec<u8>> {
        let mut h = Vec::with_capacity(HELLO);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&key.comm.to_le_bytes());
        h.extend_from_slice(&(key.from as u64).to_le_bytes());
        h.extend_from_slice(&(key.to as u64).to_le_bytes());
        h.extend_from_slice(&key.channel.to_le_bytes());
        h.extend_from_slice(&(idx as u32).to_le_bytes());
        h.extend_from_slice(&(self.nsocks as u32).to_le_bytes());
        h.extend_from_slice(&rand::random::<[u8; 16]>());
        let tag = mac(&self.secret, &h)?;
        h.extend_from_slice(&tag);
        Ok(h)
    }

    /// Checks a hello; the connection and socket index it names.
    fn check_hello(&self, h: &[u8]) -> Result<(Link, usize)> {
        if h.len() != HELLO {
            return Err(Error::transport(format!("hello of {} bytes", h.len())));
        }
        let (body, tag) = h.split_at(HELLO - 32);
        let want = mac(&self.secret, body)?;
        if &body[..4] != MAGIC || want.as_slice() != tag {
            return Err(Error::transport("hello failed authentication"));
        }
        let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_le_bytes(body[o..o + 4].try_into().unwrap_or([0; 4]));
        let (comm, from, to, channel) = (u64_at(4), u64_at(12) as usize, u64_at(20) as usize, u32_at(28));
        let (idx, nsocks) = (u32_at(32) as usize, u32_at(36) as usize);
        if to != self.me || nsocks != self.nsocks || idx >= nsocks {
            return Err(Error::transport(format!("hello for rank {to}, socket {idx} of {nsocks} does not fit")));
        }
        let nonce: [u8; 16] = body[40..56].try_into().unwrap_or([0; 16]);
        if !self.seen.lock().map_err(|_| Error::internal("nonce lock"))?.insert(nonce) {
            return Err(Error::transport("hello replayed (its nonce was seen before)"));
        }
        Ok(((comm, from, channel), idx))
    }

    /// Accepts every pending connection and reads what hellos have
    /// arrived, without blocking; keeps the authenticated connections, drops
    /// (and logs, with the source address) the rest, and any that has not
    /// said hello within [`HELLO_WITHIN`].
    fn accept(&self) {
        let Ok(mut pending) = self.pending.lock() else { return };
        while let Ok((s, from)) = self.listener.accept() {
            match s.set_nonblocking(true) {
                Ok(()) => pending.push((s, from, Instant::now() + HELLO_WITHIN, Vec::with_capacity(HELLO))),
                Err(e) => eprintln!("ccl: tcp: dropped connection from {from}: {}", io_err("accept", e)),
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let (s, _, deadline, buf) = &mut pending[i];
            let mut chunk = [0u8; HELLO];
            let outcome = match s.read(&mut chunk[..HELLO - buf.len()]) {
                Ok(0) => Some(Err(Error::transport("closed before its hello"))),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    (buf.len() == HELLO).then(|| self.check_hello(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    (Instant::now() >= *deadline).then(|| Err(Error::transport("no hello in time")))
                }
                Err(e) => Some(Err(io_err("hello", e))),
            };
            let Some(outcome) = outcome else {
                i += 1;
                continue;
            };
            let (s, from, _, _) = pending.swap_remove(i);
            let kept = outcome.and_then(|k| {
                let _ = s.set_nodelay(true);
                keepalive(&s).map_err(|e| io_err("keepalive", e))?;
                Ok(k)
            });
            match kept {
                Ok((key, idx)) => {
                    if let Ok(mut inbox) = self.inbox.lock() {
                        inbox.entry(key).or_insert_with(|| (0..self.nsocks).map(|_| None).collect())[idx] = Some(s);
                    }
                }
                Err(e) => eprintln!("ccl: tcp: dropped connection from {from}: {e}"),
            }
        }
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

/// A ring of 64-byte-aligned slots in this process's memory.
struct Slots {
    base: *mut u8,
    layout: Layout,
    slot_bytes: usize,
    n: usize,
}

// SAFETY: the ring is owned by one connection end and only touched through
// it (`&mut self`); the pointer is freed once, on drop.
unsafe impl Send for Slots {}

impl Slots {
    /// `ring.nslots` slots (at least one) of `ring.slot_bytes` rounded up to 64.
    fn new(ring: Geometry) -> Result<Self> {
        let (n, slot_bytes) = (ring.nslots.max(1), ring.slot_bytes.div_ceil(64) * 64);
        let layout =
            Layout::from_size_align((n * slot_bytes).max(64), 64).map_err(|_| Error::internal("slot layout"))?;
        // SAFETY: non-zero size.
        let base = unsafe { alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::transport("cannot allocate tcp slots"));
        }
        Ok(Slots { base, layout, slot_bytes, n })
    }
    fn ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: `i % n < n`, inside the allocation.
        unsafe { self.base.add((i % self.n) * self.slot_bytes) }
    }
    fn bytes(&mut self, i: usize, len: usize) -> &mut [u8] {
        // SAFETY: a slot of `slot_bytes ≥ len` bytes (callers check), owned by this ring.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i), len.min(self.slot_bytes)) }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.base, self.layout) }
    }
}

/// Where a queued frame's payload is.
#[derive(Clone, Copy)]
enum Payload {
    /// A slot of this end's ring.
    Slot(usize),
    /// The caller's memory, lent until written ([`TcpSend::lend`]), and
    /// the slot held for it, if the caller may take it back into that
    /// slot ([`TcpSend::reclaim`]).
    Lent(*const u8, Option<usize>),
    /// None (the lost notice).
    Empty,
}

/// The checksum word of a frame carrying `data`: CRC-32 with [`HAS_CRC`]
/// where checksums are `on`, else 0.
fn frame_check(on: bool, data: &[u8]) -> u64 {
    if on {
        HAS_CRC | u64::from(crc32fast::hash(data))
    } else {
        0
    }
}

/// A frame waiting for its socket: payload, length, fingerprint, checksum word.
#[derive(Clone, Copy)]
struct Frame {
    payload: Payload,
    len: usize,
    fp: [u64; 4],
    check: u64,
}

struct SendSock {
    stream: TcpStream,
    queue: VecDeque<Frame>,
    off: usize,
    flag: Arc<SockFlag>,
}

/// The sending end: staged slots, and lent memory, written out as the
/// sockets take them.
pub struct TcpSend {
    peer: usize,
    hosts: Arc<[String]>,
    checksum: bool,
    socks: Vec<SendSock>,
    slots: Slots,
    free: Vec<usize>,
    reserved: Option<usize>,
    next: usize,
    /// Frames of lent memory not yet fully written.
    lent: usize,
    err: Option<Error>,
}

// SAFETY: the lent pointers in the queues are only read, by whichever
// thread owns this end, and the lender keeps them valid until they are
// written or forgotten (`lend`'s contract); the rest is owned data.
unsafe impl Send for TcpSend {}

impl TcpSend {
    /// Writes what the sockets accept now; slots fully written become free.
    pub fn pump(&mut self) -> Result<()> {
        if let Some(e) = &self.err {
            return Err(e.clone());
        }
        for s in &mut self.socks {
            while let Some(&Frame { payload, len, fp, check }) = s.queue.front() {
                let data: &[u8] = match payload {
                    Payload::Slot(slot) => self.slots.bytes(slot, len),
                    // SAFETY: lent memory of `len` bytes, valid until written (`lend`).
                    Payload::Lent(p, _) => unsafe { std::slice::from_raw_parts(p, len) },
                    Payload::Empty => &[],
                };
                let r = if s.off < HEADER {
                    // header and payload in one call: one segment, not two
                    let h = header(len, &fp, check);
                    s.stream.write_vectored(&[IoSlice::new(&h[s.off..]), IoSlice::new(data)])
                } else {
                    s.stream.write(&data[s.off - HEADER..])
                };
                match r {
                    Ok(0) => return Err(self.fail("connection closed")),
                    Ok(n) => {
                        s.off += n;
                        if s.off == HEADER + len {
                            s.queue.pop_front();
                            s.off = 0;
                            match payload {
                                Payload::Slot(slot) => self.free.push(slot),
                                Payload::Lent(_, held) => {
                                    self.lent -= 1;
                                    self.free.extend(held);
                                }
                                Payload::Empty => {}
                            }
                        }
                    }
                    Err(e) if e.kind() == IoKind::WouldBlock => break,
                    Err(e) if e.kind() == IoKind::Interrupted => {}
                    Err(e) => {
                        let msg = e.to_string();
                        return Err(self.fail(&msg));
                    }
                }
            }
            s.flag.want_write.store(!s.queue.is_empty(), Ordering::Relaxed);
        }
        Ok(())
    }

    fn fail(&mut self, why: &str) -> Error {
        let host = host_of(&self.hosts, self.peer);
        let e = Error::new(ErrorKind::PeerLost { rank: self.peer, host, why: why.to_string() });
        self.err = Some(e.clone());
        e
    }

    /// Queues a last frame saying this end fails because endpoint `lost` is
    /// gone, and pushes what the sockets take now.
    pub fn announce_lost(&mut self, lost: usize) {
        for s in &mut self.socks {
            s.queue.push_back(Frame { payload: Payload::Empty, len: 0, fp: [LOST, lost as u64, 0, 0], check: 0 });
        }
        let _ = self.pump();
    }

    fn reserve(&mut self) -> Result<Option<*mut u8>> {
        self.pump()?;
        if self.reserved.is_none() {
            self.reserved = self.free.pop();
        }
        Ok(self.reserved.map(|s| self.slots.ptr(s)))
    }

    fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        if let Some(slot) = self.reserved.take() {
            let check = frame_check(self.checksum, self.slots.bytes(slot, bytes));
            self.enqueue(Frame { payload: Payload::Slot(slot), len: bytes, fp: *fp, check });
        }
    }

    /// Queues `frame` on the next socket in turn and pushes what the
    /// sockets take now.
    fn enqueue(&mut self, frame: Frame) {
        let k = self.socks.len();
        self.socks[self.next % k].queue.push_back(frame);
        self.next += 1;
        let _ = self.pump();
    }

    /// Sends `bytes` bytes at `p` as the next message, straight from there
    /// rather than through a slot. With `hold`, the slot reserved for it
    /// stays held until it is written, so that the lender may take it back
    /// ([`reclaim`](Self::reclaim)); otherwise the slot goes back.
    ///
    /// # Safety
    ///
    /// `p` must stay valid for reads of `bytes` bytes, unchanged, until
    /// [`lent`](Self::lent) says every lent frame is written,
    /// [`forget_lent`](Self::forget_lent) has run, or (held frames only)
    /// [`reclaim`](Self::reclaim) has taken it back. A held frame fits a
    /// slot (`bytes` at most [`slot_bytes`](Self::slot_bytes)).
    pub(crate) unsafe fn lend(&mut self, p: *const u8, bytes: usize, fp: &[u64; 4], hold: bool) {
        debug_assert!(!hold || bytes <= self.slots.slot_bytes, "the caller's contract");
        let slot = self.reserved.take();
        let held = if hold { slot } else { None };
        if held.is_none() {
            self.free.extend(slot);
        }
        // SAFETY: valid for `bytes` bytes (the caller's contract).
        let check = frame_check(self.checksum, unsafe { std::slice::from_raw_parts(p, bytes) });
        self.lent += 1;
        self.enqueue(Frame { payload: Payload::Lent(p, held), len: bytes, fp: *fp, check });
    }

    /// Takes back every held lent frame not yet fully written that overlaps
    /// the `bytes` bytes at `p`: its bytes go into the slot held for it and
    /// are sent from there, so the lender may overwrite them now.
    pub(crate) fn reclaim(&mut self, p: *const u8, bytes: usize) {
        if self.lent == 0 {
            return;
        }
        let (lo, hi) = (p as usize, p as usize + bytes);
        for s in &mut self.socks {
            for f in s.queue.iter_mut() {
                let Payload::Lent(q, held) = f.payload else { continue };
                if (q as usize) < hi && lo < q as usize + f.len {
                    // only held frames are ever overwritten (`Exec`'s guards)
                    debug_assert!(held.is_some(), "an unheld lent frame overlaps memory being written");
                    let Some(slot) = held else { continue };
                    // SAFETY: lent memory of `f.len` bytes, valid and unchanged
                    // until now (`lend`'s contract); the held slot is this
                    // end's, at least `f.len` bytes (`lend`'s contract), and
                    // not the lent memory.
                    unsafe { std::ptr::copy_nonoverlapping(q, self.slots.ptr(slot), f.len) };
                    f.payload = Payload::Slot(slot);
                    self.lent -= 1;
                }
            }
        }
    }

    /// Drops every lent frame not yet written, so its memory may go: the
    /// lender is failing. A frame already partly written leaves the stream
    /// cut mid-frame, so this end fails from then on.
    pub(crate) fn forget_lent(&mut self) {
        if self.lent == 0 {
            return;
        }
        let mut cut = false;
        for s in &mut self.socks {
            let partly = s.off > 0 && matches!(s.queue.front(), Some(f) if matches!(f.payload, Payload::Lent(..)));
            let free = &mut self.free;
            s.queue.retain(|f| match f.payload {
                Payload::Lent(_, held) => {
                    free.extend(held);
                    false
                }
                _ => true,
            });
            if partly {
                s.off = 0;
                cut = true;
            }
        }
        self.lent = 0;
        if cut {
            // not the peer's doing: nothing to announce as lost
            let why = format!("a failed call's data for rank {} was cut off mid-frame", self.peer);
            self.err = Some(Error::transport(why));
        }
    }
}

impl Drop for TcpSend {
    /// Whatever is still staged goes out before the sockets close; lent
    /// memory may be gone by now, so it does not.
    fn drop(&mut self) {
        self.forget_lent();
        for s in &self.socks {
            let _ = s.stream.set_nonblocking(false);
            let _ = s.stream.set_write_timeout(Some(Duration::from_secs(10)));
        }
        let _ = self.pump();
    }
}

struct RecvSock {
    stream: TcpStream,
    closed: bool,
    next: usize,
    header: [u8; HEADER],
    off: usize,
    _flag: Arc<SockFlag>,
}

/// The receiving end: frames read ahead into free slots, handed out in order.
pub struct TcpRecv {
    key: Link,
    hosts: Arc<[String]>,
    shared: Arc<Shared>,
    socks: Vec<RecvSock>,
    slots: Slots,
    lens: Vec<usize>,
    fps: Vec<[u64; 4]>,
    ready: Vec<bool>,
    tail: usize,
}

impl TcpRecv {
    fn connect(&mut self) -> bool {
        if self.socks.is_empty() {
            if let Some(streams) = self.shared.claim(self.key) {
                self.shared.unclaimed.fetch_sub(1, Ordering::Relaxed);
                let k = streams.len();
                self.socks = streams
                    .into_iter()
                    .enumerate()
                    .map(|(i, stream)| {
                        let flag = self.shared.watch(&stream, true);
                        RecvSock { stream, closed: false, next: i, header: [0; HEADER], off: 0, _flag: flag }
                    })
                    .collect();
                debug_assert_eq!(k, self.shared.nsocks);
            }
        }
        !self.socks.is_empty()
    }

    fn pump(&mut self) -> Result<()> {
        let (n, k, slot_bytes) = (self.slots.n, self.socks.len(), self.slots.slot_bytes);
        for s in &mut self.socks {
            // read ahead while the message this socket carries next has a free slot
            while !s.closed && s.next < self.tail + n {
                let slot = s.next % n;
                let r = if s.off < HEADER {
                    s.stream.read(&mut s.header[s.off..])
                } else {
                    let (len, _, _) = parse_header(&s.header);
                    s.stream.read(&mut self.slots.bytes(slot, len)[s.off - HEADER..])
                };
                match r {
                    // the peer closed: an error only if we still need a message from it
                    Ok(0) if s.off == 0 => s.closed = true,
                    Ok(0) => return Err(self.lost("connection closed in the middle of a message")),
                    Ok(got) => {
                        s.off += got;
                        let (len, fp, check) = parse_header(&s.header);
                        if s.off >= HEADER && fp[0] == LOST {
                            let root = fp[1] as usize;
                            let why = format!("reported by rank {}, which is failing because of it", self.key.1);
                            let host = host_of(&self.hosts, root);
                            return Err(Error::new(ErrorKind::PeerLost { rank: root, host, why }));
                        }
                        if s.off >= HEADER && len > slot_bytes {
                            return Err(Error::transport(format!(
                                "frame of {len} bytes exceeds a slot of {slot_bytes}"
                            )));
                        }
                        if s.off >= HEADER && s.off == HEADER + len {
                            if check & HAS_CRC != 0 && crc32fast::hash(self.slots.bytes(slot, len)) != check as u32 {
                                return Err(Error::new(ErrorKind::Corrupt {
                                    link: format!("tcp from rank {} channel {}", self.key.1, self.key.2),
                                }));
                            }
                            self.lens[slot] = len;
                            self.fps[slot] = fp;
                            self.ready[slot] = true;
                            s.next += k;
                            s.off = 0;
                        }
                    }
                    Err(e) if e.kind() == IoKind::WouldBlock => break,
                    Err(e) if e.kind() == IoKind::Interrupted => {}
                    Err(e) => return Err(io_err("read", e)),
                }
            }
        }
        Ok(())
    }

    fn lost(&self, why: &str) -> Error {
        Error::new(ErrorKind::PeerLost { rank: self.key.1, host: host_of(&self.hosts, self.key.1), why: why.into() })
    }

    fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        if !self.connect() {
            return Ok(None);
        }
        self.pump()?;
        let slot = self.tail % self.slots.n;
        if !self.ready[slot] && self.socks[self.tail % self.socks.len()].closed {
            return Err(self.lost("connection closed"));
        }
        Ok(self.ready[slot].then(|| (self.slots.ptr(slot) as *const u8, self.lens[slot], self.fps[slot])))
    }

    fn release(&mut self) {
        let slot = self.tail % self.slots.n;
        self.ready[slot] = false;
        self.tail += 1;
    }
}

/// The TCP transport of one process.
pub struct Tcp {
    shared: Arc<Shared>,
    checksum: bool,
    peers: Vec<SocketAddr>,
    /// Every endpoint's host as the errors name it: its address.
    hosts: Arc<[String]>,
    bell: Doorbell,
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
        Ok(l)
    }

    /// The transport of endpoint `me`, whose peers listen at `peers`, with
    /// `nsocks` sockets per connection; `checksum` adds a CRC32 to every
    /// payload it sends. Each connection's ring of slots is cut as its
    /// group asks when it connects.
    pub fn new(
        me: usize,
        secret: [u8; 16],
        listener: TcpListener,
        peers: Vec<SocketAddr>,
        nsocks: usize,
        checksum: bool,
    ) -> Self {
        let shared = Shared {
            me,
            secret,
            listener,
            nsocks: nsocks.max(1),
            inbox: Mutex::new(HashMap::new()),
            polled: Mutex::new(Vec::new()),
            unclaimed: AtomicUsize::new(0),
            pending: Mutex::new(Vec::new()),
            seen: Mutex::new(std::collections::HashSet::new()),
        };
        let hosts = peers.iter().map(|a| a.ip().to_string()).collect();
        Tcp { shared: Arc::new(shared), checksum, peers, hosts, bell: Doorbell::new() }
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
        let addr = *self.peers.get(key.to).ok_or_else(|| Error::internal("peer address"))?;
        let mut socks = Vec::with_capacity(self.shared.nsocks);
        for idx in 0..self.shared.nsocks {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .map_err(|e| io_err(&format!("connect to {addr}"), e))?;
            let _ = s.set_nodelay(true);
            keepalive(&s).map_err(|e| io_err("keepalive", e))?;
            s.write_all(&self.shared.hello(key, idx)?).map_err(|e| io_err("hello", e))?;
            s.set_nonblocking(true).map_err(|e| io_err("connect", e))?;
            let flag = self.shared.watch(&s, false);
            socks.push(SendSock { stream: s, queue: VecDeque::new(), off: 0, flag });
        }
        let slots = Slots::new(ring)?;
        let free = (0..slots.n).rev().collect();
        Ok(SendConn::Tcp(TcpSend {
            peer: key.to,
            hosts: Arc::clone(&self.hosts),
            checksum: self.checksum,
            socks,
            slots,
            free,
            reserved: None,
            next: 0,
            lent: 0,
            err: None,
        }))
    }

    fn connect_recv(&self, key: ConnKey, ring: Geometry) -> Result<RecvConn> {
        let slots = Slots::new(ring)?;
        let n = slots.n;
        self.shared.unclaimed.fetch_add(1, Ordering::Relaxed);
        Ok(RecvConn::Tcp(TcpRecv {
            key: (key.comm, key.from, key.channel),
            hosts: Arc::clone(&self.hosts),
            shared: Arc::clone(&self.shared),
            socks: Vec::new(),
            slots,
            lens: vec![0; n],
            fps: vec![[0; 4]; n],
            ready: vec![false; n],
            tail: 0,
        }))
    }

    fn bell(&self) -> &Doorbell {
        &self.bell
    }

    fn check_alive(&self, _peers: &[usize]) -> Result<()> {
        Ok(())
    }

    fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
        if self.shared.unclaimed.load(Ordering::Relaxed) > 0 {
            out.push(libc::pollfd { fd: self.shared.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        if let Ok(p) = self.shared.polled.lock() {
            for f in p.iter().filter_map(Weak::upgrade) {
                let events = if f.read {
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
}

/// Methods the engine reaches through [`SendConn`] and [`RecvConn`].
impl TcpSend {
    pub(crate) fn reserve_slot(&mut self) -> Result<Option<*mut u8>> {
        self.reserve()
    }
    pub(crate) fn post_slot(&mut self, bytes: usize, fp: &[u64; 4]) {
        self.post(bytes, fp)
    }
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slots.slot_bytes
    }
    pub(crate) fn slot_memory(&self) -> (*mut u8, usize) {
        (self.slots.base, self.slots.layout.size())
    }
    /// Lent frames not yet fully written.
    pub(crate) fn lent(&self) -> usize {
        self.lent
    }
}

impl TcpRecv {
    pub(crate) fn peek_slot(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        self.peek()
    }
    pub(crate) fn release_slot(&mut self) {
        self.release()
    }
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slots.slot_bytes
    }
    pub(crate) fn slot_memory(&self) -> (*mut u8, usize) {
        (self.slots.base, self.slots.layout.size())
    }
}

/// The IPv4 address of network interface `name`, if it has one.
pub fn interface_ipv4(name: &str) -> Option<std::net::Ipv4Addr> {
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
                found = Some(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
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
    use super::*;

    fn transport(me: usize, checksum: bool) -> Tcp {
        let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
        Tcp::new(me, [9; 16], l, Vec::new(), 1, checksum)
    }

    /// Polls `r` until it yields a slot or an error.
    fn next(r: &mut RecvConn) -> Result<Vec<u8>> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Some((p, len, _)) = r.peek()? {
                // SAFETY: a peeked slot of `len` bytes, ours until released.
                let v = unsafe { std::slice::from_raw_parts(p, len) }.to_vec();
                r.release();
                return Ok(v);
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
                if let Some(p) = tx.reserve()? {
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
    fn each_connection_cuts_its_ring_as_its_group_asks() {
        let rx = transport(1, false);
        let rx_addr = rx.shared.listener.local_addr().expect("addr");
        let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
        let tx = Tcp::new(0, [9; 16], l, vec![rx_addr, rx_addr], 1, false);
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
        let rx = transport(1, false);
        let rx_addr = rx.shared.listener.local_addr().expect("addr");
        let tx = Tcp::new(0, [9; 16], Tcp::listen([127, 0, 0, 1].into()).expect("listen"), vec![rx_addr; 2], 1, false);
        let ring = Geometry { nslots: 2, slot_bytes: 1024 };
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        assert!(s.lends());
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
        let rx = transport(1, true);
        let rx_addr = rx.shared.listener.local_addr().expect("addr");
        let tx = Tcp::new(0, [9; 16], Tcp::listen([127, 0, 0, 1].into()).expect("listen"), vec![rx_addr; 2], 1, true);
        let ring = Geometry { nslots: 2, slot_bytes: 1 << 20 };
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let (mut s, mut r) = (tx.connect_send(key, ring).expect("send"), rx.connect_recv(key, ring).expect("recv"));
        let t = Instant::now();
        let reserve = |s: &mut SendConn| {
            while s.reserve().expect("reserve").is_none() && t.elapsed() < Duration::from_secs(10) {}
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
        assert!(s.reserve().expect("reserve").is_none(), "held frames keep their slots");
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
        let addr = rx.shared.listener.local_addr().expect("addr");
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
    fn only_fresh_hellos_with_the_secret_get_in() {
        let rx = transport(1, false);
        let key = ConnKey { comm: 7, from: 0, to: 1, channel: 0 };
        let addr = rx.shared.listener.local_addr().expect("addr");
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
