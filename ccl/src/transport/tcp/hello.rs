//! The hello that opens each socket: it names the connection, carries a
//! fresh nonce, and is authenticated by an HMAC of the job secret; the
//! listener keeps the sockets whose hello verifies.

use super::{io_err, keepalive, Link, Shared};
use crate::error::{Error, Result};
use crate::transport::admit::{self, Caps, DropLog};
use crate::transport::ConnKey;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The first bytes of every hello.
const MAGIC: &[u8; 4] = b"CCLT";
/// Bytes of a hello: magic, communicator, sender, receiver, channel, socket
/// index, sockets per connection, nonce, and the HMAC tag over all of them.
pub(super) const HELLO: usize = 4 + 8 + 8 + 8 + 4 + 4 + 4 + 16 + 32;

/// An accepted socket waiting for its hello: source, when it was accepted,
/// bytes so far.
pub(super) type Unhello = (TcpStream, std::net::SocketAddr, Instant, Vec<u8>);

impl admit::Waiting for Unhello {
    fn source(&self) -> std::net::IpAddr {
        self.1.ip()
    }
    fn since(&self) -> Instant {
        self.2
    }
    fn proved(&self) -> bool {
        false // a socket whose hello verifies leaves the queue at once
    }
}

/// How long an accepted connection has to send its hello.
const HELLO_WITHIN: Duration = Duration::from_secs(5);

/// Connections that may wait for their hello at once, from one address
/// and from all: beyond either, the oldest of the busiest source gives way
/// to the newcomer ([`admit`]). The hellos that have arrived are read at
/// least every quarter of the per-address cap of newcomers, so a peer's
/// socket is read several times before it could be pushed out; a peer
/// pushed out all the same connects again ([`ACK`]).
const UNHELLOED: Caps = Caps { per_source: 128, total: 1024 };

/// The byte a listener sends back on a data socket whose hello it kept:
/// until it comes, the sender writes nothing else there, and a socket
/// closed before it is connected again.
pub(super) const ACK: u8 = 0x06;

/// Dropped connections, said at most once a second.
static DROPS: DropLog = DropLog::new("tcp");

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
    /// arrived, without blocking; keeps the authenticated connections
    /// (acknowledged with [`ACK`]), drops (and says, with the source
    /// address) the rest, and any that has not said hello within
    /// [`HELLO_WITHIN`]. While newcomers push out waiting connections, the
    /// hellos that have arrived are read between them ([`UNHELLOED`]).
    pub(super) fn accept(&self) {
        let Ok(mut pending) = self.pending.lock() else { return };
        self.read_hellos(&mut pending);
        // accepted since the hellos were last read: a waiting socket is read
        // several times before enough newcomers come to push it out
        let mut unread = 0;
        let accepted = self.listeners.iter().flat_map(|l| std::iter::from_fn(move || l.accept().ok()));
        for (s, from) in accepted {
            unread += 1;
            if unread >= UNHELLOED.per_source / 4 && admit::victim(&pending, from.ip(), UNHELLOED).is_some() {
                self.read_hellos(&mut pending);
                unread = 0;
            }
            if let Some(i) = admit::victim(&pending, from.ip(), UNHELLOED) {
                let gone = pending.swap_remove(i);
                DROPS.dropped(gone.1, &"no hello yet, and too many like it");
            }
            match s.set_nonblocking(true) {
                Ok(()) => pending.push((s, from, Instant::now(), Vec::with_capacity(HELLO))),
                Err(e) => DROPS.dropped(from, &io_err("accept", e)),
            }
        }
        self.read_hellos(&mut pending);
    }

    /// Reads what hellos have arrived on the `pending` sockets, keeping the
    /// connections whose hello verifies and dropping the failed and late.
    fn read_hellos(&self, pending: &mut Vec<Unhello>) {
        let mut i = 0;
        while i < pending.len() {
            let (s, _, since, buf) = &mut pending[i];
            let mut chunk = [0u8; HELLO];
            let outcome = match s.read(&mut chunk[..HELLO - buf.len()]) {
                Ok(0) => Some(Err(Error::transport("closed before its hello"))),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    (buf.len() == HELLO).then(|| self.check_hello(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    (since.elapsed() >= HELLO_WITHIN).then(|| Err(Error::transport("no hello in time")))
                }
                Err(e) => Some(Err(io_err("hello", e))),
            };
            let Some(outcome) = outcome else {
                i += 1;
                continue;
            };
            let (mut s, from, _, _) = pending.swap_remove(i);
            let kept = outcome.and_then(|k| {
                let _ = s.set_nodelay(true);
                keepalive(&s).map_err(|e| io_err("keepalive", e))?;
                Ok(k)
            });
            match kept {
                Ok((key, _)) if key.2 == super::notice::NOTICE => self.keep_notice(key.1, s),
                Ok((key, idx)) => match s.write(&[ACK]) {
                    Ok(1) => {
                        if let Ok(mut inbox) = self.inbox.lock() {
                            let socks = inbox.entry(key).or_insert_with(|| (0..self.nsocks).map(|_| None).collect());
                            socks[idx] = Some(s);
                        }
                    }
                    _ => DROPS.dropped(from, &"closed as its hello was acknowledged"),
                },
                Err(e) => DROPS.dropped(from, &e),
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
                    fds.extend(sh.listeners.iter().map(|l| libc::pollfd {
                        fd: l.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }));
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
