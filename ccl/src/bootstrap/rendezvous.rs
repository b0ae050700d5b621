//! The rendezvous: every rank connects once, proves it knows the secret,
//! says who it is, and receives the table of all ranks. `cclrun` hosts the
//! server; [`join`] is the rank side.

use super::auth;
use super::id::UniqueId;
use super::wire::{read_frame, write_frame, Dec, Enc, MAX_FRAME};
use crate::error::{Error, Result};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
}

/// Ranks a table may hold.
const MAX_RANKS: usize = 1 << 20;
/// How long one connection may take to authenticate and say hello.
const PER_CONN: Duration = Duration::from_secs(10);
/// Connections that may be authenticating at once; the oldest is dropped
/// to make room for a new one (a rank's hello takes milliseconds, an idle
/// stranger's all of [`PER_CONN`]).
const HANDSHAKES: usize = 256;

fn encode(e: &mut Enc, p: &PeerInfo) {
    e.u64(p.rank as u64).u64(u64::from(p.pid)).str(&p.host).str(&p.addr).str(&p.machine);
}

fn decode(d: &mut Dec) -> Result<PeerInfo> {
    let rank = d.bounded(MAX_RANKS)?;
    let pid = u32::try_from(d.u64()?).map_err(|_| Error::transport("pid out of range"))?;
    Ok(PeerInfo { rank, pid, host: d.str()?, addr: d.str()?, machine: d.str()? })
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
        let addr = listener.local_addr().map_err(super::wire::io)?;
        Ok(Rendezvous { listener, id: UniqueId::new(addr), nranks })
    }

    /// Listens on `addr` for the job `id` names (its secret; ranks reach
    /// the server at `id.addr`, which may differ from `addr`, e.g. `0.0.0.0`).
    pub fn bind_for(addr: SocketAddr, id: UniqueId, nranks: usize) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::transport(format!("rendezvous bind {addr}: {e}")))?;
        Ok(Rendezvous { listener, id, nranks })
    }

    /// The id ranks need (address and secret).
    pub fn id(&self) -> &UniqueId {
        &self.id
    }

    /// Accepts ranks until all `nranks` have said hello, then sends each the
    /// table. Each connection authenticates on a thread of its own, so
    /// idle or slow strangers hold up no rank; at most `HANDSHAKES` at a
    /// time, the oldest dropped for a newcomer. Connections that fail
    /// authentication or send garbage are dropped and logged with their
    /// source address; the others go on.
    pub fn serve(self, timeout: Duration) -> Result<Vec<PeerInfo>> {
        let deadline = Instant::now() + timeout;
        self.listener.set_nonblocking(true).map_err(super::wire::io)?;
        let mut joined: Vec<Option<(TcpStream, PeerInfo)>> = (0..self.nranks).map(|_| None).collect();
        let mut count = 0;
        type Hello = (u64, SocketAddr, Result<(TcpStream, PeerInfo)>);
        let (done_tx, done) = std::sync::mpsc::channel::<Hello>();
        // handshakes in flight: a handle to shut each down, oldest first
        let mut busy: std::collections::VecDeque<(u64, TcpStream)> = Default::default();
        let mut next = 0u64;
        let (secret, nranks) = (*self.id.secret(), self.nranks);
        while count < self.nranks {
            while let Ok((n, from, hello)) = done.try_recv() {
                busy.retain(|(m, _)| *m != n);
                match hello {
                    Ok((stream, info)) if joined[info.rank].is_none() => {
                        let r = info.rank;
                        joined[r] = Some((stream, info));
                        count += 1;
                    }
                    Ok((_, info)) => eprintln!("ccl: rendezvous: dropped {from}: rank {} joined twice", info.rank),
                    Err(e) => eprintln!("ccl: rendezvous: dropped connection from {from}: {e}"),
                }
            }
            if count == self.nranks {
                break;
            }
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if busy.len() >= HANDSHAKES {
                        if let Some((_, oldest)) = busy.pop_front() {
                            let _ = oldest.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    let Ok(handle) = stream.try_clone() else { continue };
                    busy.push_back((next, handle));
                    let tx = done_tx.clone();
                    let n = next;
                    next += 1;
                    std::thread::spawn(move || {
                        let _ = tx.send((n, from, hello(stream, &secret, nranks)));
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
        for (_, s) in busy {
            let _ = s.shutdown(std::net::Shutdown::Both);
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

/// One connection's authentication and hello, for a job of `nranks`.
fn hello(mut s: TcpStream, secret: &[u8], nranks: usize) -> Result<(TcpStream, PeerInfo)> {
    let io = super::wire::io;
    s.set_nonblocking(false).map_err(io)?;
    s.set_read_timeout(Some(PER_CONN)).map_err(io)?;
    s.set_write_timeout(Some(PER_CONN)).map_err(io)?;
    auth::server(&mut s, secret)?;
    let f = read_frame(&mut s, 64 << 10)?;
    let (n, info) = decode_hello(&f)?;
    if n != nranks || info.rank >= n {
        return Err(Error::transport(format!("rank {} of {n} does not fit a job of {nranks}", info.rank)));
    }
    s.set_read_timeout(None).map_err(io)?;
    Ok((s, info))
}

/// Joins the job behind `id` as `me`; the table of all `nranks` ranks.
pub fn join(id: &UniqueId, me: &PeerInfo, nranks: usize, timeout: Duration) -> Result<Vec<PeerInfo>> {
    let io = super::wire::io;
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match TcpStream::connect_timeout(&id.addr, Duration::from_secs(2)) {
            Ok(s) => break s,
            // not listening yet: retry until the deadline
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(Error::transport(format!("cannot reach the rendezvous at {}: {e}", id.addr))),
        }
    };
    s.set_read_timeout(Some(PER_CONN)).map_err(io)?;
    auth::client(&mut s, id.secret())?;
    let mut e = Enc::default();
    e.u64(nranks as u64);
    encode(&mut e, me);
    write_frame(&mut s, &e.0)?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(io)?;
    let waited = Instant::now();
    // a read that ran out of time is the rendezvous timing out
    let f = read_frame(&mut s, MAX_FRAME).map_err(|e| {
        if waited.elapsed() + Duration::from_millis(50) < left {
            return e;
        }
        let waiting = format!("for the rendezvous at {} to hear from every rank (CCL_TIMEOUT)", id.addr);
        Error::new(crate::ErrorKind::Timeout { secs: waited.elapsed().as_secs_f64(), waiting })
    })?;
    let table = decode_table(&f)?;
    let n = table.len();
    if n != nranks || table.iter().enumerate().any(|(i, p)| p.rank != i) {
        return Err(Error::transport("rendezvous sent an inconsistent table"));
    }
    Ok(table)
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
        let me = PeerInfo { rank: 0, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into() };
        assert!(join(&fake, &me, 3, Duration::from_secs(5)).is_err());
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
        let idle: Vec<TcpStream> = (0..HANDSHAKES + 20).filter_map(|_| TcpStream::connect(id.addr).ok()).collect();
        assert!(idle.len() > HANDSHAKES);
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let me = PeerInfo { rank: r, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into() };
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
    fn a_rank_waiting_for_absent_ones_times_out_in_words() {
        let rv = Rendezvous::bind("127.0.0.1:0".parse().expect("addr"), 2).expect("bind");
        let id = rv.id().clone();
        let server = std::thread::spawn(move || rv.serve(Duration::from_secs(2)));
        let me = PeerInfo { rank: 0, host: "h".into(), pid: 1, addr: String::new(), machine: "m".into() };
        let e = join(&id, &me, 2, Duration::from_secs(1)).expect_err("rank 1 never comes").to_string();
        assert!(e.contains("timed out after") && e.contains("rendezvous"), "{e}");
        assert!(!e.contains("os error"), "{e}");
        let e = server.join().expect("server").expect_err("rank 1 never came").to_string();
        assert!(e.contains("waiting for rank(s) 1"), "{e}");
    }
}
