//! A software queue pair: its requests go out on the connection it dials
//! (answered there, in order), its peer's come in on the one the peer
//! dials. Three threads per connected pair: the requester (sends posted
//! writes), the acknowledger (matches answers to them, and times out a
//! silent peer) and the responder (lands the peer's writes).

use super::{Dev, INTRO, MAGIC};
use crate::error::{Error, Result};
use crate::transport::rdma::verbs::{Completion, Done, LinkLayer, QpInfo, QueuePair, Remote, Sge, Status};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use crate::config::SoftFaultKind;
use std::time::{Duration, Instant};

/// A request frame's header: opcode, immediate, rkey, bytes, address.
const HEADER: usize = 1 + 4 + 4 + 4 + 8;
const OP_WRITE: u8 = 1;
const OP_WRITE_IMM: u8 = 2;
/// How often a waiting acknowledger checks for a silent peer.
const TICK: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Init,
    Ready,
    Error,
}

struct Wr {
    wr_id: u64,
    local: Vec<Sge>,
    remote: Remote,
    imm: Option<u32>,
    signaled: bool,
}

#[derive(Default)]
struct Queues {
    sq: VecDeque<Wr>,
    /// Sent, unanswered: id, signaled, when sent.
    unacked: VecDeque<(u64, bool, Instant)>,
    rq: VecDeque<u64>,
    cq: VecDeque<Completion>,
    /// The peer closed its end while nothing was outstanding.
    peer_gone: bool,
    /// The peer's connection has arrived (only one is taken).
    incoming: bool,
}

/// What the queue pair's threads share.
pub(super) struct Shared {
    dev: Arc<Dev>,
    qpn: u32,
    token: [u8; 16],
    depth: usize,
    phase: Mutex<(Phase, Queues)>,
    more: Condvar,
    /// The completion channel: an eventfd counting completions.
    event: OwnedFd,
    /// Both connections, to close when the queue pair errs.
    streams: Mutex<Vec<TcpStream>>,
}

/// A queue pair of a [`SoftDevice`](super::SoftDevice).
pub(super) struct SoftQp {
    shared: Arc<Shared>,
}

fn status_code(s: Status) -> u8 {
    match s {
        Status::Success => 0,
        Status::RemoteAccess => 1,
        Status::ReceiverNotReady => 2,
        _ => 3,
    }
}

fn code_status(b: u8) -> Status {
    match b {
        0 => Status::Success,
        1 => Status::RemoteAccess,
        2 => Status::ReceiverNotReady,
        c => Status::Other(i32::from(c)),
    }
}

impl SoftQp {
    pub(super) fn new(dev: &Arc<Dev>, qpn: u32, depth: usize) -> Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::transport(format!("soft rdma eventfd: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: `fd` is a fresh descriptor owned by nothing else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared {
            dev: Arc::clone(dev),
            qpn,
            token: rand::random(),
            depth: depth.max(1),
            phase: Mutex::new((Phase::Init, Queues::default())),
            more: Condvar::new(),
            event,
            streams: Mutex::default(),
        });
        Ok(SoftQp { shared })
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, (Phase, Queues)> {
        self.phase.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a completion and counts it on the channel.
    fn complete(&self, q: &mut Queues, c: Completion) {
        q.cq.push_back(c);
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Moves to the error state: `first` (a request's id, and why) gets its
    /// status, every other outstanding request a flush; the connections close.
    fn fail(&self, first: Option<(u64, Status)>) {
        let mut g = self.lock();
        let (phase, q) = &mut *g;
        if *phase == Phase::Error {
            return;
        }
        *phase = Phase::Error;
        if let Some((wr_id, status)) = first {
            q.unacked.retain(|u| u.0 != wr_id);
            self.complete(q, Completion { wr_id, status, done: Done::Write });
        }
        let flushed: Vec<u64> =
            q.unacked.drain(..).map(|u| u.0).chain(q.sq.drain(..).map(|w| w.wr_id)).chain(q.rq.drain(..)).collect();
        for wr_id in flushed {
            self.complete(q, Completion { wr_id, status: Status::Flushed, done: Done::Write });
        }
        drop(g);
        self.more.notify_all();
        if let Ok(s) = self.streams.lock() {
            s.iter().for_each(|s| drop(s.shutdown(Shutdown::Both)));
        }
    }

    fn keep(&self, s: &TcpStream) -> std::io::Result<TcpStream> {
        let c = s.try_clone()?;
        if let Ok(mut v) = self.streams.lock() {
            v.push(s.try_clone()?);
        }
        Ok(c)
    }

    /// A connection from the peer, which proved `token`: its requests.
    pub(super) fn attach_incoming(self: &Arc<Self>, s: TcpStream, token: &[u8; 16]) {
        let same = token.iter().zip(self.token).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
        let mut g = self.lock();
        if !same || g.0 == Phase::Error || g.1.incoming {
            return;
        }
        g.1.incoming = true;
        drop(g);
        let _ = s.set_nodelay(true);
        let _ = crate::transport::tcp::keepalive(&s);
        if self.keep(&s).is_err() {
            return;
        }
        let me = Arc::clone(self);
        let _ = std::thread::Builder::new().name("ccl-soft-resp".into()).spawn(move || me.respond(s));
    }

    /// Lands the peer's writes, answering each.
    fn respond(&self, mut s: TcpStream) {
        let mut h = [0u8; HEADER];
        while s.read_exact(&mut h).is_ok() {
            let op = h[0];
            let imm = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
            let rkey = u32::from_le_bytes([h[5], h[6], h[7], h[8]]);
            let len = u32::from_le_bytes([h[9], h[10], h[11], h[12]]);
            let addr = u64::from_le_bytes(h[13..21].try_into().unwrap_or_default());
            // a queue pair in error answers nothing, as hardware drops what
            // comes for it: the requester finds the peer gone
            let Some(status) = self.land(&mut s, op, imm, rkey, len, addr) else { return };
            if s.write_all(&[status_code(status)]).is_err() {
                break;
            }
            if status != Status::Success {
                // as a responder's QP does on a remote access error
                self.fail(None);
                return;
            }
        }
        // the peer is gone: requests posted from now on fail
        let mut g = self.lock();
        g.1.peer_gone = true;
        drop(g);
        self.more.notify_all();
    }

    /// Lands one write of `len` bytes read from `s` at `addr` of the region
    /// `rkey` names, consuming a posted receive if it carries an immediate;
    /// `None` where this queue pair is in error (its receives flushed).
    fn land(&self, s: &mut TcpStream, op: u8, imm: u32, rkey: u32, len: u32, addr: u64) -> Option<Status> {
        let drain = |s: &mut TcpStream| drop(std::io::copy(&mut s.take(u64::from(len)), &mut std::io::sink()));
        if op != OP_WRITE && op != OP_WRITE_IMM {
            return Some(Status::Other(-1));
        }
        let Some(region) = self.dev.region(rkey, addr, u64::from(len)) else {
            drain(s);
            return Some(Status::RemoteAccess);
        };
        let recv = {
            let mut g = self.lock();
            if g.0 == Phase::Error {
                return None;
            }
            match (op == OP_WRITE_IMM).then(|| g.1.rq.pop_front()) {
                Some(None) => {
                    drop(g);
                    drain(s);
                    return Some(Status::ReceiverNotReady);
                }
                r => r.flatten(),
            }
        };
        let live = region.live.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !*live {
            drop(live);
            drain(s);
            return Some(Status::RemoteAccess);
        }
        let read = if len == 8 && addr.is_multiple_of(8) {
            let mut b = [0u8; 8];
            s.read_exact(&mut b).map(|()| {
                // SAFETY: 8 aligned bytes inside a live registered region (checked above,
                // held live by `live`); atomic so that a reader never sees half of it.
                unsafe { AtomicU64::from_ptr(addr as *mut u64) }.store(u64::from_le_bytes(b), Ordering::Release)
            })
        } else {
            // SAFETY: `[addr, addr + len)` lies inside a registered region, kept
            // valid by its registrant until deregistered, which waits for `live`.
            let dst = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
            s.read_exact(dst)
        };
        drop(live);
        if read.is_err() {
            return Some(Status::Other(-2));
        }
        if let Some(wr_id) = recv {
            let mut g = self.lock();
            self.complete(&mut g.1, Completion { wr_id, status: Status::Success, done: Done::Recv { imm, len } });
        }
        Some(Status::Success)
    }

    /// Sends posted writes until the queue pair errs.
    fn request(&self, mut s: TcpStream) {
        loop {
            let mut g = self.lock();
            while g.0 == Phase::Ready && g.1.sq.is_empty() {
                g = self.more.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if g.0 != Phase::Ready {
                return;
            }
            let Some(wr) = g.1.sq.pop_front() else { continue };
            if g.1.peer_gone {
                drop(g);
                return self.fail(Some((wr.wr_id, Status::RetryExceeded)));
            }
            g.1.unacked.push_back((wr.wr_id, wr.signaled, Instant::now()));
            drop(g);
            if let Err(st) = self.send(&mut s, &wr) {
                return self.fail(Some((wr.wr_id, st)));
            }
        }
    }

    /// Writes one request's frame, reading its local pieces.
    fn send(&self, s: &mut TcpStream, wr: &Wr) -> std::result::Result<(), Status> {
        let len: u64 = wr.local.iter().map(|g| u64::from(g.len)).sum();
        let len = u32::try_from(len).map_err(|_| Status::LocalProtection)?;
        let regions = wr
            .local
            .iter()
            .map(|g| self.dev.region(g.lkey, g.addr as u64, u64::from(g.len)).ok_or(Status::LocalProtection))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut h = Vec::with_capacity(HEADER);
        h.push(if wr.imm.is_some() { OP_WRITE_IMM } else { OP_WRITE });
        h.extend_from_slice(&wr.imm.unwrap_or(0).to_le_bytes());
        h.extend_from_slice(&wr.remote.rkey.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        h.extend_from_slice(&wr.remote.addr.to_le_bytes());
        s.write_all(&h).map_err(|_| Status::RetryExceeded)?;
        for (g, r) in wr.local.iter().zip(&regions) {
            let live = r.live.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !*live {
                return Err(Status::LocalProtection);
            }
            // SAFETY: inside a live registered region (checked), which the
            // poster keeps unchanged until the request completes.
            let src = unsafe { std::slice::from_raw_parts(g.addr as *const u8, g.len as usize) };
            s.write_all(src).map_err(|_| Status::RetryExceeded)?;
        }
        Ok(())
    }

    /// Matches the peer's answers to sent requests, in order; a peer
    /// silent for the device's retry time with requests outstanding fails
    /// the queue pair.
    fn acknowledge(&self, mut s: TcpStream) {
        let _ = s.set_read_timeout(Some(TICK));
        let mut b = [0u8; 1];
        loop {
            let got = s.read(&mut b);
            let mut g = self.lock();
            if g.0 != Phase::Ready {
                return;
            }
            match got {
                Ok(1) => {
                    let Some((wr_id, signaled, _)) = g.1.unacked.pop_front() else {
                        drop(g);
                        return self.fail(None); // an answer to nothing
                    };
                    match code_status(b[0]) {
                        Status::Success if signaled => {
                            self.complete(&mut g.1, Completion { wr_id, status: Status::Success, done: Done::Write })
                        }
                        Status::Success => {}
                        st => {
                            g.1.unacked.push_front((wr_id, signaled, Instant::now()));
                            drop(g);
                            return self.fail(Some((wr_id, st)));
                        }
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if let Some(&(wr_id, _, at)) = g.1.unacked.front() {
                        if at.elapsed() > self.dev.retry {
                            drop(g);
                            return self.fail(Some((wr_id, Status::RetryExceeded)));
                        }
                    }
                }
                _ => {
                    // closed: outstanding requests will never be answered
                    g.1.peer_gone = true;
                    let first = g.1.unacked.front().map(|u| u.0).or_else(|| g.1.sq.front().map(|w| w.wr_id));
                    drop(g);
                    if let Some(wr_id) = first {
                        return self.fail(Some((wr_id, Status::RetryExceeded)));
                    }
                    self.more.notify_all();
                    return;
                }
            }
        }
    }
}

/// `ip:port` and a token, as [`QpInfo::extra`] carries them.
fn encode_extra(addr: SocketAddr, token: &[u8; 16]) -> [u8; 40] {
    let mut e = [0u8; 40];
    let ip = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    e[..16].copy_from_slice(&ip.octets());
    e[16..18].copy_from_slice(&addr.port().to_le_bytes());
    e[18..34].copy_from_slice(token);
    e
}

fn decode_extra(e: &[u8; 40]) -> (SocketAddr, [u8; 16]) {
    let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(&e[..16]).unwrap_or_default());
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    let port = u16::from_le_bytes([e[16], e[17]]);
    (SocketAddr::new(ip, port), e[18..34].try_into().unwrap_or_default())
}

impl QueuePair for SoftQp {
    fn info(&self) -> QpInfo {
        let s = &self.shared;
        QpInfo {
            qpn: s.qpn,
            psn: 0,
            lid: 0,
            gid: [0; 16],
            link: LinkLayer::Ethernet,
            extra: encode_extra(s.dev.addr, &s.token),
        }
    }

    fn connect(&mut self, peer: &QpInfo) -> Result<()> {
        let s = &self.shared;
        let (addr, token) = decode_extra(&peer.extra);
        let err = |e: std::io::Error| Error::transport(format!("soft rdma connect to queue pair {} at {addr}: {e}", peer.qpn));
        if s.lock().0 != Phase::Init {
            return Err(Error::transport("soft rdma: queue pair connected twice"));
        }
        let mut out = TcpStream::connect_timeout(&addr, s.dev.retry).map_err(err)?;
        let _ = out.set_nodelay(true);
        let _ = crate::transport::tcp::keepalive(&out);
        let mut intro = Vec::with_capacity(INTRO);
        intro.extend_from_slice(MAGIC);
        intro.extend_from_slice(&peer.qpn.to_le_bytes());
        intro.extend_from_slice(&token);
        out.write_all(&intro).map_err(err)?;
        let acks = s.keep(&out).map_err(err)?;
        s.lock().0 = Phase::Ready;
        let (a, b) = (Arc::clone(s), Arc::clone(s));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map(drop).map_err(err)
        };
        spawn("ccl-soft-req", Box::new(move || a.request(out)))?;
        spawn("ccl-soft-ack", Box::new(move || b.acknowledge(acks)))
    }

    unsafe fn post_write(&mut self, wr_id: u64, local: &[Sge], mut remote: Remote, imm: Option<u32>, signaled: bool)
        -> Result<()> {
        let s = &self.shared;
        match s.dev.fault_now() {
            Some(SoftFaultKind::Rkey) => remote.rkey ^= 0x5a5a,
            Some(SoftFaultKind::Error) => s.fail(None),
            None => {}
        }
        let mut g = s.lock();
        let (phase, q) = &mut *g;
        match phase {
            Phase::Init => return Err(Error::transport("soft rdma: a write posted to an unconnected queue pair")),
            Phase::Error => {
                s.complete(q, Completion { wr_id, status: Status::Flushed, done: Done::Write });
                return Ok(());
            }
            Phase::Ready => {}
        }
        if q.sq.len() + q.unacked.len() >= s.depth {
            return Err(Error::transport(format!("soft rdma: send queue full ({} requests)", s.depth)));
        }
        q.sq.push_back(Wr { wr_id, local: local.to_vec(), remote, imm, signaled });
        drop(g);
        s.more.notify_all();
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        let s = &self.shared;
        let mut g = s.lock();
        let (phase, q) = &mut *g;
        if *phase == Phase::Error {
            s.complete(q, Completion { wr_id, status: Status::Flushed, done: Done::Write });
        } else if q.rq.len() >= s.depth {
            return Err(Error::transport(format!("soft rdma: receive queue full ({} requests)", s.depth)));
        } else {
            q.rq.push_back(wr_id);
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<()> {
        let mut g = self.shared.lock();
        let n = g.1.cq.len().min(max);
        out.extend(g.1.cq.drain(..n));
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }

    fn arm(&mut self) -> Result<()> {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.shared.event.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        Ok(())
    }

    #[cfg(test)]
    fn fail(&mut self) {
        self.shared.fail(None);
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let s = &self.shared;
        s.lock().0 = Phase::Error;
        s.more.notify_all();
        if let Ok(v) = s.streams.lock() {
            v.iter().for_each(|t| drop(t.shutdown(Shutdown::Both)));
        }
    }
}
