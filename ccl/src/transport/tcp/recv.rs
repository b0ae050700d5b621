//! The receiving end of a TCP connection: frames read ahead into free
//! slots, or straight into the call's memory where the call has given a
//! place for them, handed out in message order.

use super::frame::{parse_header, HAS_CRC, HEADER, LOST};
use super::slots::Slots;
use super::{host_of, io_err, Link, Shared, SockFlag};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::{Offers, RecvVerbs};
use std::collections::VecDeque;
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
    /// Where the payload of the frame being read goes instead of its slot:
    /// decided once its header is in, before its first payload byte.
    land: Option<Place>,
    _flag: Arc<SockFlag>,
}

/// A place in a call's memory that a message is read into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place(*mut u8);

// SAFETY: a place is written only through the connection end holding it,
// under the contract of `TcpRecv::post_into`; nothing ties it to a thread.
unsafe impl Send for Place {}

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
    /// Per slot: the place its message was read into instead, if any.
    landed: Vec<Option<Place>>,
    /// Places given for coming messages ([`post_into`](Self::post_into)):
    /// message number, place, bytes it holds; in message order.
    posted: VecDeque<(usize, Place, usize)>,
    tail: usize,
}

impl TcpRecv {
    /// The receiving end of connection `key` (its sockets claimed from
    /// `shared` once they arrive; `hosts` names the sender's host),
    /// reading ahead into `slots`.
    pub(super) fn new(key: Link, hosts: Arc<[String]>, shared: Arc<Shared>, slots: Slots) -> Self {
        let n = slots.n;
        let (lens, fps, ready, landed) = (vec![0; n], vec![[0; 4]; n], vec![false; n], vec![None; n]);
        let posted = VecDeque::new();
        TcpRecv { key, hosts, shared, socks: Vec::new(), slots, lens, fps, ready, landed, posted, tail: 0 }
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
                        let header = [0; HEADER];
                        RecvSock { stream, closed: false, next: i, header, off: 0, land: None, _flag: flag }
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
                    if s.off == HEADER {
                        s.land = place_for(&self.posted, s.next, len);
                    }
                    let into = match s.land {
                        // SAFETY: a place given for this message that holds
                        // `len` bytes (`place_for`), ours to write until the
                        // message is released or the place withdrawn
                        // (`post_into`'s contract).
                        Some(p) => unsafe { std::slice::from_raw_parts_mut(p.0, len) },
                        None => self.slots.bytes(slot, len),
                    };
                    s.stream.read(&mut into[s.off - HEADER..])
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
                            self.landed[slot] = s.land.take();
                            let got = match self.landed[slot] {
                                // SAFETY: the place the payload was just read into (above).
                                Some(p) => unsafe { std::slice::from_raw_parts(p.0, len) },
                                None => self.slots.bytes(slot, len),
                            };
                            if check & HAS_CRC != 0 && crc32fast::hash(got) != check as u32 {
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
                    // a peer that ends with bytes unread (an acknowledgement
                    // that came late) resets rather than closes: the same
                    // between messages
                    Err(e) if e.kind() == IoKind::ConnectionReset && s.off == 0 => s.closed = true,
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
        let at = self.landed[slot].map_or(self.slots.ptr(slot), |p| p.0) as *const u8;
        Ok(self.ready[slot].then(|| (at, self.lens[slot], self.fps[slot])))
    }

    fn release(&mut self) {
        let slot = self.tail % self.slots.n;
        self.ready[slot] = false;
        self.landed[slot] = None;
        while self.posted.front().is_some_and(|&(m, _, _)| m <= self.tail) {
            self.posted.pop_front();
        }
        self.tail += 1;
    }

    /// Gives the message `ahead` after the next one to be handed out a
    /// place of `cap` bytes at `p`: if its payload has not started to
    /// arrive by then, and fits, it is read there instead of into a slot,
    /// and [`peek`](Self::peek) hands out `p`. A message given a place
    /// already keeps it.
    ///
    /// # Safety
    ///
    /// `p` must be valid for writes of `cap` bytes, and nothing else may
    /// read or write them, until the message has been released or
    /// [`withdraw`](Self::withdraw) has run.
    pub(crate) unsafe fn post_into(&mut self, ahead: usize, p: *mut u8, cap: usize) {
        let m = self.tail + ahead;
        if self.posted.back().is_none_or(|&(last, _, _)| last < m) {
            self.posted.push_back((m, Place(p), cap));
        }
    }

    /// Takes back every place given ([`post_into`](Self::post_into)):
    /// what has been read into one so far moves into its slot, and the
    /// rest of its frame follows there.
    pub(crate) fn withdraw(&mut self) {
        self.posted.clear();
        let n = self.slots.n;
        for s in &mut self.socks {
            if let Some(p) = s.land.take() {
                let got = s.off.saturating_sub(HEADER);
                // SAFETY: `got` bytes read into the place (still valid
                // until this returns), into the free slot of the message.
                unsafe { std::ptr::copy_nonoverlapping(p.0, self.slots.ptr(s.next), got) };
            }
        }
        for slot in 0..n {
            if let Some(p) = self.landed[slot].take() {
                // SAFETY: the message read into the place, into its own slot.
                unsafe { std::ptr::copy_nonoverlapping(p.0, self.slots.ptr(slot), self.lens[slot]) };
            }
        }
    }
}

/// The place given for message `m` of `len` bytes, if any and it fits.
fn place_for(posted: &VecDeque<(usize, Place, usize)>, m: usize, len: usize) -> Option<Place> {
    posted.iter().find(|&&(at, _, _)| at == m).and_then(|&(_, p, cap)| (len <= cap).then_some(p))
}

/// Slots read ahead from sockets, or straight into the call's memory.
const OFFERS: Offers = Offers { lends: false, lands: true, pollable: true, staged: true, read_elsewhere: false };

impl RecvVerbs for TcpRecv {
    fn offers(&self) -> Offers {
        OFFERS
    }
    fn slot_bytes(&self) -> usize {
        self.slots.slot_bytes
    }
    fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        TcpRecv::peek(self)
    }
    fn release(&mut self) {
        TcpRecv::release(self)
    }
    unsafe fn post_into(&mut self, ahead: usize, p: *mut u8, cap: usize) {
        // SAFETY: the caller's contract is post_into's.
        unsafe { TcpRecv::post_into(self, ahead, p, cap) }
    }
    fn withdraw(&mut self) {
        TcpRecv::withdraw(self)
    }
    fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        Some((self.slots.base, self.slots.layout.size()))
    }
}

#[cfg(test)]
impl TcpRecv {
    /// Bytes of the frame in progress read so far on the first socket.
    pub(crate) fn read_so_far(&self) -> usize {
        self.socks.first().map_or(0, |s| s.off)
    }
}
