//! The receiving end of a TCP connection: frames read ahead into free
//! slots, handed out in message order.

use super::frame::{parse_header, HAS_CRC, HEADER, LOST};
use super::slots::Slots;
use super::{host_of, io_err, Link, Shared, SockFlag};
use crate::error::{Error, ErrorKind, Result};
use std::io::{ErrorKind as IoKind, Read};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    /// The receiving end of connection `key` (its sockets claimed from
    /// `shared` once they arrive; `hosts` names the sender's host),
    /// reading ahead into `slots`.
    pub(super) fn new(key: Link, hosts: Arc<[String]>, shared: Arc<Shared>, slots: Slots) -> Self {
        let n = slots.n;
        let (lens, fps, ready) = (vec![0; n], vec![[0; 4]; n], vec![false; n]);
        TcpRecv { key, hosts, shared, socks: Vec::new(), slots, lens, fps, ready, tail: 0 }
    }

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
