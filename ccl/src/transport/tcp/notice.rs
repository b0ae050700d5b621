//! Calls told across hosts. Ranks of one host read each other's last
//! calls on their doorbell pages ([`CallBoard`]); a peer on another host
//! has no page to read, so a rank stuck on it connects to it on a channel
//! of its own ([`NOTICE`]), with the usual authenticated hello, and sends
//! its last calls. The peer keeps what it is told, for the comparison
//! its own stuck calls make ([`Transport::peer_call`]).
//!
//! [`CallBoard`]: crate::transport::call_board::CallBoard
//! [`Transport::peer_call`]: crate::transport::Transport::peer_call

use super::{io_err, Shared, Tcp};
use crate::error::Result;
use crate::transport::call_board::Words;
use crate::transport::ConnKey;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The channel of a hello that opens a notice: no connection's.
pub(super) const NOTICE: u32 = u32::MAX;

/// Bytes of one told call: communicator, then the four words.
const RECORD: usize = 40;

/// Notice sockets, and calls told, kept at most.
const KEPT: (usize, usize) = (64, 4096);

/// What peers told this rank: their open notice sockets (sender, socket,
/// bytes of a record so far) and the calls read from them.
#[derive(Default)]
pub(super) struct Told {
    socks: Vec<(usize, TcpStream, Vec<u8>)>,
    calls: HashMap<(usize, u64, u64), Words>,
}

impl Shared {
    /// Keeps the notice socket `s` that endpoint `from` opened.
    pub(super) fn keep_notice(&self, from: usize, s: TcpStream) {
        let Ok(mut told) = self.told.lock() else { return };
        if told.socks.len() >= KEPT.0 {
            told.socks.remove(0);
        }
        told.socks.push((from, s, Vec::with_capacity(RECORD)));
    }

    /// What endpoint `from` told of call `seq` of communicator `comm`,
    /// after reading what has arrived.
    pub(super) fn told(&self, from: usize, comm: u64, seq: u64) -> Option<Words> {
        let mut told = self.told.lock().ok()?;
        let Told { socks, calls } = &mut *told;
        socks.retain_mut(|(sender, s, buf)| {
            let mut chunk = [0u8; RECORD * 16];
            loop {
                match s.read(&mut chunk) {
                    Ok(0) => return false,
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        for r in buf.chunks_exact(RECORD) {
                            let w = |i: usize| u64::from_le_bytes(r[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
                            if calls.len() >= KEPT.1 {
                                calls.clear();
                            }
                            calls.insert((*sender, w(0), w(4)), [w(1), w(2), w(3), w(4)]);
                        }
                        let whole = buf.len() / RECORD * RECORD;
                        buf.drain(..whole);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                    Err(_) => return false,
                }
            }
        });
        calls.get(&(from, comm, seq)).copied()
    }
}

impl Tcp {
    /// Tells endpoint `peer` this rank's last `calls` of communicator
    /// `comm` (once for each latest call), on a notice connection made by
    /// a thread of its own: a peer out of reach holds up nothing (its
    /// loss is for the liveness checks to find).
    pub(super) fn tell(&self, peer: usize, comm: u64, calls: &[Words]) -> Result<()> {
        let Some(latest) = calls.iter().map(|c| c[3]).max() else { return Ok(()) };
        let first = self.told_to.lock().is_ok_and(|mut t| t.insert((peer, comm, latest)));
        let Some(&(_, addr)) = self.peers.get(peer).and_then(|a| a.first()).filter(|_| first && peer != self.shared.me) else {
            return Ok(());
        };
        let mut bytes = self.shared.hello(ConnKey { comm, from: self.shared.me, to: peer, channel: NOTICE }, 0)?;
        for c in calls {
            bytes.extend(std::iter::once(comm).chain(c.iter().copied()).flat_map(u64::to_le_bytes));
        }
        let send = move || -> std::io::Result<()> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(&bytes)
        };
        std::thread::Builder::new()
            .name("ccl-tcp-notice".into())
            .spawn(move || {
                let _ = send();
            })
            .map(drop)
            .map_err(|e| io_err("notice thread", e))
    }
}
