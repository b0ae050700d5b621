//! The sending end of a TCP connection: slots staged here, and memory
//! lent by a call, written to the sockets as they take them.

use super::frame::{frame_check, header, HEADER, LOST};
use super::hello::ACK;
use super::slots::Slots;
use super::{host_of, Dial, SockFlag};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::admit::DropLog;
use crate::transport::{Offers, SendVerbs};
use std::collections::VecDeque;
use std::io::{ErrorKind as IoKind, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Sockets opened again, said at most once a second.
static REDIALS: DropLog = DropLog::new("tcp");

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
    /// The peer's listener kept this socket ([`ACK`]): until then nothing
    /// is written to it.
    acked: bool,
    /// Times the peer's listener closed this socket before keeping it (a
    /// flood of strangers pushing it out), and it was opened again.
    redials: usize,
}

/// What waiting for a socket's acknowledgement found.
enum Ack {
    /// It came: write away.
    Came,
    /// Not yet (or the socket was opened again): write nothing now.
    Waiting,
}

/// The sending end: staged slots, and lent memory, written out as the
/// sockets take them.
pub struct TcpSend {
    peer: usize,
    dial: Dial,
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
    /// The sending end of `dial`'s connection (whose peer's host `hosts`
    /// names) over `socks`, connected and watched, staging in `slots`;
    /// `checksum` adds a CRC32 to every frame.
    pub(super) fn new(
        hosts: Arc<[String]>,
        checksum: bool,
        dial: Dial,
        socks: Vec<(TcpStream, Arc<SockFlag>)>,
        slots: Slots,
    ) -> Self {
        let socks = socks.into_iter().map(|(stream, flag)| SendSock {
            stream,
            queue: VecDeque::new(),
            off: 0,
            flag,
            acked: false,
            redials: 0,
        });
        let free = (0..slots.n).rev().collect();
        TcpSend {
            peer: dial.key.to,
            dial,
            hosts,
            checksum,
            socks: socks.collect(),
            slots,
            free,
            reserved: None,
            next: 0,
            lent: 0,
            err: None,
        }
    }

    /// Reads socket `idx`'s acknowledgement if it has come; where the
    /// peer's listener closed the socket first, opens it again. A peer
    /// whose listener is gone (the connection refused) is lost.
    fn await_ack(s: &mut SendSock, dial: &Dial, idx: usize) -> std::result::Result<Ack, String> {
        let mut b = [0u8; 1];
        match (&s.stream).read(&mut b) {
            Ok(1) if b[0] == ACK => {
                s.acked = true;
                s.flag.want_read.store(false, Ordering::Relaxed);
                return Ok(Ack::Came);
            }
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => return Ok(Ack::Waiting),
            _ => {}
        }
        s.redials += 1;
        let (stream, flag) = dial.connect(idx).map_err(|e| {
            format!("{e} (connecting again: the connection had closed before its hello was acknowledged, {} time(s))", s.redials)
        })?;
        if s.redials.is_power_of_two() {
            REDIALS.note(&format_args!(
                "the listener of rank {} at {} closed a connection before reading its hello {} time(s) (a flood of \
                 connections to it?); connecting again",
                dial.key.to, dial.addr, s.redials
            ));
        }
        (s.stream, s.flag) = (stream, flag);
        Ok(Ack::Waiting)
    }

    /// Writes what the sockets accept now; slots fully written become free.
    pub fn pump(&mut self) -> Result<()> {
        if let Some(e) = &self.err {
            return Err(e.clone());
        }
        for (idx, s) in self.socks.iter_mut().enumerate() {
            if !s.acked {
                match Self::await_ack(s, &self.dial, idx) {
                    Ok(Ack::Came) => {}
                    Ok(Ack::Waiting) => continue,
                    Err(why) => return Err(self.fail(&why)),
                }
            }
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
        // reads the acknowledgements that have come (one left unread would
        // make the close a reset), and writes what the sockets take now
        let _ = self.pump();
        if self.socks.iter().all(|s| s.queue.is_empty()) {
            return;
        }
        for s in &self.socks {
            let _ = s.stream.set_nonblocking(false);
            let _ = s.stream.set_write_timeout(Some(Duration::from_secs(10)));
            let _ = s.stream.set_read_timeout(Some(Duration::from_secs(10)));
        }
        let _ = self.pump();
    }
}

/// Staged slots written to sockets, or the caller's memory lent.
const OFFERS: Offers = Offers { lends: true, lands: false, pollable: true, staged: true, read_elsewhere: false };

impl SendVerbs for TcpSend {
    fn offers(&self) -> Offers {
        OFFERS
    }
    fn slot_bytes(&self) -> usize {
        self.slots.slot_bytes
    }
    fn reserve(&mut self, _bytes: usize, _spread: bool) -> Result<Option<*mut u8>> {
        TcpSend::reserve(self)
    }
    fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        TcpSend::post(self, bytes, fp)
    }
    fn flush(&mut self) -> Result<()> {
        self.pump()
    }
    fn announce_lost(&mut self, lost: usize) {
        TcpSend::announce_lost(self, lost)
    }
    unsafe fn lend(&mut self, p: *const u8, bytes: usize, fp: &[u64; 4], hold: bool) -> Result<()> {
        if hold && bytes > self.slots.slot_bytes {
            return Err(Error::internal(format!("a held message of {bytes} B exceeds a slot")));
        }
        // SAFETY: the caller's contract is lend's; a held message fits a
        // slot (checked above).
        unsafe { TcpSend::lend(self, p, bytes, fp, hold) };
        Ok(())
    }
    fn lent(&self) -> usize {
        self.lent
    }
    fn reclaim(&mut self, p: *const u8, bytes: usize) {
        TcpSend::reclaim(self, p, bytes)
    }
    fn forget_lent(&mut self) {
        TcpSend::forget_lent(self)
    }
    fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        Some((self.slots.base, self.slots.layout.size()))
    }
}
