//! The rendezvous: every rank connects once, proves it knows the secret,
//! says who it is, and receives the table of all ranks. `cclrun` hosts the
//! server; [`join`] is the rank side.

use super::auth;
use super::id::UniqueId;
use super::wire::{read_frame, write_frame, Dec, Enc, MAX_FRAME};
use crate::error::{Error, Result};
use crate::transport::admit::{self, Caps, DropLog};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a rank tells the others about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// World rank.
    pub rank: usize,
    /// Host identity (hostname + boot id, or `CCL_HOSTID`).
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Where its TCP transport listens (may be empty).
    pub addr: String,
    /// The machine (hostname and boot id, whatever `CCL_HOSTID` says):
    /// ranks on one machine share its cores.
    pub machine: String,
    /// Its RDMA port's link layer (`ib`, `eth`), empty where it has none.
    pub rdma: String,
}

/// Ranks a table may hold.
const MAX_RANKS: usize = 1 << 20;
/// How long a connection may take to prove the job's key: a rank's proof
/// takes milliseconds, and a rank whose connection is dropped tries again.
const AUTH_WITHIN: Duration = Duration::from_secs(2);
/// How long a connection that proved the key may take to say hello.
const PER_CONN: Duration = Duration::from_secs(10);
/// Connections that may be authenticating at once, from one address and
/// from all ([`admit`]): beyond either, the oldest unauthenticated one of
/// the busiest source gives way, never one that proved the key.
const HANDSHAKES: Caps = Caps { per_source: 256, total: 512 };
/// How a rank's join waits between tries.
const RETRY: Duration = Duration::from_millis(20);

/// Dropped connections, said at most once a second.
static DROPS: DropLog = DropLog::new("rendezvous");

/// A handshake in flight: its number, a handle to shut it down, its
/// source, when it began, and whether it has proved the key.
struct Handshake(u64, TcpStream, SocketAddr, Instant, Arc<AtomicBool>);

impl admit::Waiting for Handshake {
    fn source(&self) -> std::net::IpAddr {
        self.2.ip()
    }
    fn since(&self) -> Instant {
        self.3
    }
    fn proved(&self) -> bool {
        self.4.load(Ordering::Relaxed)
    }
}

fn encode(e: &mut Enc, p: &PeerInfo) {
    e.u64(p.rank as u64).u64(u64::from(p.pid)).str(&p.host).str(&p.addr).str(&p.machine).str(&p.rdma);
}

fn decode(d: &mut Dec) -> Result<PeerInfo> {
    let rank = d.bounded(MAX_RANKS)?;
    let pid = u32::try_from(d.u64()?).map_err(|_| Error::transport("pid out of range"))?;
    Ok(PeerInfo { rank, pid, host: d.str()?, addr: d.str()?, machine: d.str()?, rdma: d.str()? })
}

/// Decodes a rank's hello (world size and its [`PeerInfo`]); malformed
/// input is an error.
pub fn decode_hello(bytes: &[u8]) -> Result<(usize, PeerInfo)> {
    let mut d = Dec(bytes);
    let n = d.bounded(MAX_RANKS)?;
    let info = decode(&mut d)?;
    d.end()?;
    Ok((n, info))
}

/// Decodes the table the rendezvous sends; malformed input is an error.
pub fn decode_table(bytes: &[u8]) -> Result<Vec<PeerInfo>> {
    let mut d = Dec(bytes);
    let n = d.bounded(MAX_RANKS)?;
    // each entry takes at least 40 bytes: no allocation beyond the input
    if n > bytes.len() / 40 {
        return Err(Error::transport(format!("table of {n} ranks in {} bytes", bytes.len())));
    }
    let table: Vec<PeerInfo> = (0..n).map(|_| decode(&mut d)).collect::<Result<_>>()?;
    d.end()?;
    Ok(table)
}

/// The server side, bound and ready before any rank starts.
pub struct Rendezvous {
    listener: TcpListener,
    id: UniqueId,
    nranks: usize,
}

impl Rendezvous {
    /// Listens on `addr` (port 0 picks one) for `nranks` ranks, under a fresh secret.
    pub fn bind(addr: SocketAddr, nranks: usize) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::transport(format!("rendezvous bind {addr}: {e}")))?;
        admit::deepen_backlog(&listener);
        let addr = listener.local_addr().map_err(super::wire::io)?;
        Ok(Rendezvous { listener, id: UniqueId::new(addr), nranks })
    }

    /// Listens on `addr` for the job `id` names (its secret; ranks reach
    /// the server at `id.addr`, which may differ from `addr`, e.g. `0.0.0.0`).
    pub fn bind_for(addr: SocketAddr, id: UniqueId, nranks: usize) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::transport(format!("rendezvous bind {addr}: {e}")))?;
        admit::deepen_backlog(&listener);
        Ok(Rendezvous { listener, id, nranks })
    }

    /// The id ranks need (address and secret).
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// Accepts ranks until all `nranks` have said hello, then sends each the
    /// table. Each connection authenticates on a thread of its own, so
    /// idle or slow strangers hold up no rank; under a flood, the
    /// unauthenticated give way as `transport::admit` says, and ranks
    /// pushed out try again (`join`). Connections that fail authentication or send
    /// garbage are dropped and said (at most a line a second); the others
    /// go on. A rank that joins again (its first connection lost) takes
    /// its place anew.
    pub fn serve(self, timeout: Duration) -> Result<Vec<PeerInfo>> {
        let deadline = Instant::now() + timeout;
        self.listener.set_nonblocking(true).map_err(super::wire::io)?;
        let mut joined: Vec<Option<(TcpStream, PeerInfo)>> = (0..self.nranks).map(|_| None).collect();
        let mut count = 0;
        type Hello = (u64, SocketAddr, Result<(TcpStream, PeerInfo)>);
        let (done_tx, done) = std::sync::mpsc::channel::<Hello>();
        let mut busy: Vec<Handshake> = Vec::new();
        let mut next = 0u64;
        let (secret, nranks) = (*self.id.secret(), self.nranks);
        while count < self.nranks {
            while let Ok((n, from, hello)) = done.try_recv() {
                busy.retain(|h| h.0 != n);
                match hello {
                    Ok((stream, info)) => {
                        let r = info.rank;
                        count += usize::from(joined[r].is_none());
                        joined[r] = Some((stream, info));
                    }
                    Err(e) => DROPS.dropped(from, &e),
                }
            }
            if count == self.nranks {
                break;
            }
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if let Some(i) = admit::victim(&busy, from.ip(), HANDSHAKES) {
                        let gone = busy.swap_remove(i);
                        let _ = gone.1.shutdown(std::net::Shutdown::Both);
                    } else if busy.len() >= HANDSHAKES.total {
                        continue; // every slot holds a proved rank: the newcomer goes
                    }
                    let Ok(handle) = stream.try_clone() else { continue };
                    let proved = Arc::new(AtomicBool::new(false));
                    busy.push(Handshake(next, handle, from, Instant::now(), Arc::clone(&proved)));
                    let tx = done_tx.clone();
                    let n = next;
                    next += 1;
                    std::thread::spawn(move || {
                        let _ = tx.send((n, from, hello(stream, &secret, nranks, &proved)));
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = joined
                            .iter()
                            .enumerate()
                            .filter(|(_, j)| j.is_none())
                            .map(|(r, _)| r.to_string())
                            .collect();
                        return Err(Error::transport(format!(
                            "rendezvous timed out after {:.0} s waiting for rank(s) {}",
                            timeout.as_secs_f64(),
                            missing.join(", ")
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(Error::transport(format!("rendezvous accept: {e}"))),
            }
        }
        for h in busy {
            let _ = h.1.shutdown(std::net::Shutdown::Both);
        }
        let table: Vec<PeerInfo> = joined.iter().flatten().map(|(_, i)| i.clone()).collect();
        let mut e = Enc::default();
        e.u64(table.len() as u64);
        table.iter().for_each(|p| encode(&mut e, p));
        for (mut s, info) in joined.into_iter().flatten() {
            write_frame(&mut s, &e.0).map_err(|err| err.with_peer(info.rank))?;
        }
        Ok(table)
    }
}

/// One connection's authentication and hello, for a job of `nranks`;
/// `proved` is set once it has proved the key.
fn hello(mut s: TcpStream, secret: &[u8], nranks: usize, proved: &AtomicBool) -> Result<(TcpStream, PeerInfo)> {
    let io = super::wire::io;
    s.set_nonblocking(false).map_err(io)?;
    s.set_read_timeout(Some(AUTH_WITHIN)).map_err(io)?;
    s.set_write_timeout(Some(AUTH_WITHIN)).map_err(io)?;
    auth::server(&mut s, secret)?;
    proved.store(true, Ordering::Relaxed);
    s.set_read_timeout(Some(PER_CONN)).map_err(io)?;
    s.set_write_timeout(Some(PER_CONN)).map_err(io)?;
    let f = read_frame(&mut s, 64 << 10)?;
    let (n, info) = decode_hello(&f)?;
    if n != nranks || info.rank >= n {
        return Err(Error::transport(format!("rank {} of {n} does not fit a job of {nranks}", info.rank)));
    }
    s.set_read_timeout(None).map_err(io)?;
    Ok((s, info))
}

/// Joins the job behind `id` as `me`; the table of all `nranks` ranks.
/// A connection lost before the table comes (the rendezvous not yet
/// listening, or pushing this one out under a flood of strangers) is
/// tried again until `timeout`.
pub fn join(id: &UniqueId, me: &PeerInfo, nranks: usize, timeout: Duration) -> Result<Vec<PeerInfo>> {
    let deadline = Instant::now() + timeout;
    let mut tries = 0;
    let table = loop {
        tries += 1;
        match join_once(id, me, nranks, deadline) {
            Ok(f) => break decode_table(&f)?,
            Err(e) if matches!(e.kind(), crate::ErrorKind::Timeout { .. }) => return Err(e),
            Err(e) if Instant::now() + RETRY >= deadline => {
                return Err(Error::transport(format!(
                    "cannot join the rendezvous at {} in {:.0} s ({tries} tries; the last: {e})",
                    id.addr,
                    timeout.as_secs_f64()
                )))
            }
            Err(_) => std::thread::sleep(RETRY),
        }
    };
    let n = table.len();
    if n != nranks || table.iter().enumerate().any(|(i, p)| p.rank != i) {
        return Err(Error::transport("rendezvous sent an inconsistent table"));
    }
    Ok(table)
}

/// One try of [`join`]: connect, prove the key, say hello, and wait for
/// the table's frame until `deadline`.
fn join_once(id: &UniqueId, me: &PeerInfo, nranks: usize, deadline: Instant) -> Result<Vec<u8>> {
    let io = super::wire::io;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut s = TcpStream::connect_timeout(&id.addr, left().min(Duration::from_secs(2)))
        .map_err(|e| Error::transport(format!("cannot reach the rendezvous at {}: {e}", id.addr)))?;
    s.set_read_timeout(Some(left().min(PER_CONN))).map_err(io)?;
    s.set_write_timeout(Some(left().min(PER_CONN))).map_err(io)?;
    auth::client(&mut s, id.secret())?;
    let mut e = Enc::default();
    e.u64(nranks as u64);
    encode(&mut e, me);
    write_frame(&mut s, &e.0)?;
    let left = left();
    s.set_read_timeout(Some(left)).map_err(io)?;
    let waited = Instant::now();
    // a read that ran out of time is the rendezvous timing out
    read_frame(&mut s, MAX_FRAME).map_err(|e| {
        if waited.elapsed() + Duration::from_millis(50) < left {
            return e;
        }
        let waiting = format!("for the rendezvous at {} to hear from every rank (CCL_TIMEOUT)", id.addr);
        Error::new(crate::ErrorKind::Timeout { secs: waited.elapsed().as_secs_f64(), waiting })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_the_table_and_impostors_are_dropped() {
        let rv = Rendezvous::bind("127.0.0.1:0".parse().expect("addr"), 3).expect("bind");
        let id = rv.id().clone();
        let server = std::thread::spawn(move || rv.serve(Duration::from_secs(20)));
        // an impostor with the right address but a wrong secret
        let fake = UniqueId::parse(&format!("ccl1@{}#{}", id.addr, "00".repeat(16))).expect("fake");
        let me = PeerInfo { rank: 0, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into(), rdma: String::new() };
        let e = join(&fake, &me, 3, Duration::from_secs(1)).expect_err("no secret").to_string();
        assert!(e.contains("cannot join the rendezvous") && e.contains("tries"), "{e}");
        // garbage bytes
        if let Ok(mut s) = TcpStream::connect(id.addr) {
            use std::io::Write;
            let _ = s.write_all(&[0xff; 100]);
        }
        let ranks: Vec<_> = (0..3)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let me = PeerInfo {
                        rank: r,
                        host: format!("host{}", r % 2),
                        pid: 100 + r as u32,
                        addr: String::new(),
                        machine: "m".into(),
                        rdma: String::new(),
                    };
                    join(&id, &me, 3, Duration::from_secs(20))
                })
            })
            .collect();
        for t in ranks {
            let table = t.join().expect("rank thread").expect("joined");
            assert_eq!(table.len(), 3);
            assert_eq!(table[2].pid, 102);
            assert_eq!(table[1].host, "host1");
        }
        assert_eq!(server.join().expect("server").expect("served").len(), 3);
    }

    #[test]
    fn idle_strangers_hold_up_no_rank() {
        let rv = Rendezvous::bind("127.0.0.1:0".parse().expect("addr"), 2).expect("bind");
        let id = rv.id().clone();
        let server = std::thread::spawn(move || rv.serve(Duration::from_secs(60)));
        // more idle connections than may authenticate at once, each of
        // which a one-at-a-time server waited 10 s for
        let idle: Vec<TcpStream> =
            (0..HANDSHAKES.per_source + 20).filter_map(|_| TcpStream::connect(id.addr).ok()).collect();
        assert!(idle.len() > HANDSHAKES.per_source);
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let me = PeerInfo { rank: r, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into(), rdma: String::new() };
                    // well within what the idle ones would have taken one by one
                    join(&id, &me, 2, Duration::from_secs(20))
                })
            })
            .collect();
        for t in ranks {
            assert_eq!(t.join().expect("rank").expect("joined").len(), 2);
        }
        assert_eq!(server.join().expect("server").expect("served").len(), 2);
        drop(idle);
    }

    #[test]
    fn connections_opened_and_closed_in_a_flood_push_out_no_rank() {
        let rv = Rendezvous::bind("127.0.0.1:0".parse().expect("addr"), 4).expect("bind");
        let id = rv.id().clone();
        let server = std::thread::spawn(move || rv.serve(Duration::from_secs(60)));
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // two flooders, each opening (and at once closing, or holding the
        // last 300) thousands of connections until the ranks are in
        let flooders: Vec<_> = (0..2)
            .map(|k| {
                let (stop, opened, addr) = (Arc::clone(&stop), Arc::clone(&opened), id.addr);
                std::thread::spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    for _ in 0..50_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Ok(c) = TcpStream::connect(addr) {
                            opened.fetch_add(1, Ordering::Relaxed);
                            if k == 1 {
                                held.push_back(c);
                                if held.len() > 300 {
                                    held.pop_front();
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        // the ranks come once the flood is in full swing
        let t = Instant::now();
        while opened.load(Ordering::Relaxed) < 2000 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(opened.load(Ordering::Relaxed) >= 2000, "the flood never got going");
        let ranks: Vec<_> = (0..4)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let me = PeerInfo { rank: r, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into(), rdma: String::new() };
                    join(&id, &me, 4, Duration::from_secs(30))
                })
            })
            .collect();
        for t in ranks {
            assert_eq!(t.join().expect("rank").expect("joined despite the flood").len(), 4);
        }
        stop.store(true, Ordering::Relaxed);
        flooders.into_iter().for_each(|f| f.join().expect("flooder"));
        assert_eq!(server.join().expect("server").expect("served").len(), 4);
    }

    #[test]
    fn a_rank_waiting_for_absent_ones_times_out_in_words() {
        let rv = Rendezvous::bind("127.0.0.1:0".parse().expect("addr"), 2).expect("bind");
        let id = rv.id().clone();
        let server = std::thread::spawn(move || rv.serve(Duration::from_secs(2)));
        let me = PeerInfo { rank: 0, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into(), rdma: String::new() };
        let e = join(&id, &me, 2, Duration::from_secs(1)).expect_err("rank 1 never comes").to_string();
        assert!(e.contains("timed out after") && e.contains("rendezvous"), "{e}");
        assert!(!e.contains("os error"), "{e}");
        let e = server.join().expect("server").expect_err("rank 1 never came").to_string();
        assert!(e.contains("waiting for rank(s) 1"), "{e}");
    }
}
