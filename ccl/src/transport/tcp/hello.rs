//! The hello that opens each socket: it names the connection, carries a
//! fresh nonce, and is authenticated by an HMAC of the job secret; the
//! listener keeps the sockets whose hello verifies.

use super::{io_err, keepalive, Link, Shared};
use crate::error::{Error, Result};
use crate::transport::ConnKey;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The first bytes of every hello.
const MAGIC: &[u8; 4] = b"CCLT";
/// Bytes of a hello: magic, communicator, sender, receiver, channel, socket
/// index, sockets per connection, nonce, and the HMAC tag over all of them.
pub(super) const HELLO: usize = 4 + 8 + 8 + 8 + 4 + 4 + 4 + 16 + 32;

/// An accepted socket waiting for its hello: source, deadline, bytes so far.
pub(super) type Unhello = (TcpStream, std::net::SocketAddr, Instant, Vec<u8>);

/// How long an accepted connection has to send its hello.
const HELLO_WITHIN: Duration = Duration::from_secs(5);

/// Connections from one address that may wait for their hello at once,
/// and from all addresses: beyond either, the oldest gives way to the
/// newcomer (a peer's hello follows its connect at once; an idle
/// stranger's never comes).
const UNHELLOED: (usize, usize) = (128, 1024);

/// Says that a connection from `from` was dropped and why: at most one
/// line a second, with how many went unsaid, so a flood of strangers
/// cannot flood the job's output too.
fn dropped(from: std::net::SocketAddr, why: &dyn std::fmt::Display) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    static UNSAID: AtomicU64 = AtomicU64::new(0);
    let Ok(mut last) = LAST.lock() else { return };
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
        UNSAID.fetch_add(1, Ordering::Relaxed);
        return;
    }
    *last = Some(Instant::now());
    match UNSAID.swap(0, Ordering::Relaxed) {
        0 => eprintln!("ccl: tcp: dropped connection from {from}: {why}"),
        n => eprintln!("ccl: tcp: dropped connection from {from}: {why} (and {n} more since the last such line)"),
    }
}

/// The HMAC-SHA256 of `bytes` under the job's `secret`.
fn mac(secret: &[u8], bytes: &[u8]) -> Result<[u8; 32]> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Error::internal("hmac key"))?;
    m.update(b"ccl-tcp");
    m.update(bytes);
    Ok(m.finalize().into_bytes().into())
}

impl Shared {
    /// The hello of socket `idx` of connection `key`, with a fresh nonce.
    pub(super) fn hello(&self, key: ConnKey, idx: usize) -> Result<Vec<u8>> {
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
    pub(super) fn accept(&self) {
        let Ok(mut pending) = self.pending.lock() else { return };
        while let Ok((s, from)) = self.listener.accept() {
            // where too many wait from this address (`same`) or from any,
            // the oldest of them
            let oldest = |p: &[Unhello], same: bool| {
                let of: Vec<usize> = (0..p.len()).filter(|&i| !same || p[i].1.ip() == from.ip()).collect();
                let cap = if same { UNHELLOED.0 } else { UNHELLOED.1 };
                if of.len() < cap {
                    return None;
                }
                of.into_iter().min_by_key(|&i| p[i].2)
            };
            if let Some(i) = oldest(&pending, true).or_else(|| oldest(&pending, false)) {
                let gone = pending.swap_remove(i);
                dropped(gone.1, &"no hello yet, and too many like it");
            }
            match s.set_nonblocking(true) {
                Ok(()) => pending.push((s, from, Instant::now() + HELLO_WITHIN, Vec::with_capacity(HELLO))),
                Err(e) => dropped(from, &io_err("accept", e)),
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
                Ok((key, _)) if key.2 == super::notice::NOTICE => self.keep_notice(key.1, s),
                Ok((key, idx)) => {
                    if let Ok(mut inbox) = self.inbox.lock() {
                        inbox.entry(key).or_insert_with(|| (0..self.nsocks).map(|_| None).collect())[idx] = Some(s);
                    }
                }
                Err(e) => dropped(from, &e),
            }
        }
    }

    /// Accepts and checks hellos on a thread of its own whenever no
    /// connection of this rank waits for its sockets (while one does, the
    /// engine accepts them itself, woken by the listener), so that a rank
    /// busy elsewhere still empties its listener's backlog and idle
    /// strangers cannot fill it. Ends once the transport is gone.
    pub(super) fn accept_in_background(shared: &std::sync::Arc<Shared>) {
        use std::os::unix::io::AsRawFd;
        use std::sync::atomic::Ordering;
        let weak = std::sync::Arc::downgrade(shared);
        let spawned = std::thread::Builder::new().name("ccl-tcp-accept".into()).spawn(move || loop {
            let mut fds = Vec::new();
            {
                let Some(sh) = weak.upgrade() else { return };
                if sh.unclaimed.load(Ordering::Relaxed) == 0 {
                    fds.push(libc::pollfd { fd: sh.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 });
                    if let Ok(p) = sh.pending.lock() {
                        fds.extend(p.iter().map(|u| libc::pollfd {
                            fd: u.0.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        }));
                    }
                }
            }
            if fds.is_empty() {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            // SAFETY: `fds` is a valid array of pollfd for the call; a
            // descriptor closed meanwhile only makes poll return early.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            let Some(sh) = weak.upgrade() else { return };
            if sh.unclaimed.load(Ordering::Relaxed) == 0 {
                sh.accept();
            }
        });
        if let Err(e) = spawned {
            eprintln!("ccl: tcp: no thread to accept connections between calls ({e}); they wait for the next call");
        }
    }
}
