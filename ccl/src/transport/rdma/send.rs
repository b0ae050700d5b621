//! The sending end of an RDMA connection: slots staged in registered
//! memory here, each written into the receiver's slot of the same number
//! with one write with immediate (the immediate: the message's sequence
//! number); the receiver's credit word, written by the receiver, says how
//! many of its slots it has freed. A message lent from memory the caller
//! registered (`rdma/spans.rs`) is written straight from there,
//! its fingerprint from the slot after it, in the same write.

use super::mem::Registered;
use super::qps::Qps;
use super::setup::{Hello, Setup};
use super::verbs::{Completion, Remote, Sge, Status};
use super::{Link, FP};
use crate::error::{Error, Result};
use crate::transport::{Offers, SendVerbs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The sending end.
pub struct RdmaSend {
    qps: Qps,
    link: Link,
    setup: Box<Setup>,
    ring: Registered,
    /// Word 0: slots the receiver has freed, written by the receiver.
    credit: Registered,
    nslots: usize,
    /// Bytes a message may have, and from one slot to the next.
    slot_bytes: usize,
    stride: usize,
    /// The receiver's slots, once it has answered.
    remote: Option<Remote>,
    /// Messages posted, handed to the queue pairs (all, once connected),
    /// and written (every one before it too: the queue pairs complete
    /// theirs in order, but not in step with each other).
    posted: u64,
    written: u64,
    done: u64,
    /// Slots whose write has completed, ahead of `done`.
    completed: Vec<bool>,
    /// Bytes of each slot's message.
    lens: Vec<usize>,
    /// Each slot's message lent from registered memory, until its write
    /// completes: where it is, and its registration's `lkey`.
    from: Vec<Option<(usize, u32)>>,
    /// Lent messages whose writes have not completed.
    lent: usize,
    err: Option<Error>,
    comps: Vec<(usize, Completion)>,
}

impl RdmaSend {
    pub(super) fn new(link: Link, qps: Qps, mut setup: Setup, nslots: usize, slot_bytes: usize) -> Result<Self> {
        let stride = (slot_bytes + FP).next_multiple_of(64);
        let ring = Registered::new(link.dev(), nslots * stride)?;
        let credit = Registered::new(link.dev(), 64)?;
        let at = Remote { addr: credit.mr().addr as u64, rkey: credit.mr().rkey };
        setup.say(&Hello { qps: qps.infos(), at, nslots: nslots as u32, stride: stride as u32 })?;
        Ok(RdmaSend {
            qps,
            link,
            setup: Box::new(setup),
            ring,
            credit,
            nslots,
            slot_bytes,
            stride,
            remote: None,
            posted: 0,
            written: 0,
            done: 0,
            completed: vec![false; nslots],
            lens: vec![0; nslots],
            from: vec![None; nslots],
            lent: 0,
            err: None,
            comps: Vec::new(),
        })
    }

    /// Slots the receiver has freed.
    fn credits(&self) -> u64 {
        // SAFETY: the credit word is 8 aligned bytes of `credit`, alive as long as
        // `self`; the receiver's writes land whole (an aligned 8-byte write).
        unsafe { AtomicU64::from_ptr(self.credit.ptr().cast::<u64>()) }.load(Ordering::Acquire)
    }

    fn fail(&mut self, e: Error) -> Error {
        let e = e.with_peer(self.link.peer);
        self.err.get_or_insert(e).clone()
    }

    /// Connects once the receiver has answered; then takes completions.
    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.err {
            return Err(e.clone());
        }
        if self.remote.is_none() {
            let heard = self.setup.heard_cut(self.nslots, self.stride, "receiver");
            let Some(h) = heard.map_err(|e| self.fail(e))? else { return Ok(()) };
            self.qps.connect(&self.link, &h.qps).map_err(|e| self.fail(e))?;
            self.link.connected("send");
            self.remote = Some(h.at);
            self.write_out()?;
        }
        self.poll()
    }

    fn poll(&mut self) -> Result<()> {
        self.comps.clear();
        self.qps.poll(&mut self.comps).map_err(|e| self.fail(e))?;
        let n = self.nslots as u64;
        for i in 0..self.comps.len() {
            let (_, c) = self.comps[i];
            if c.status != Status::Success {
                return Err(self.fail(self.link.failed(c.status)));
            }
            if c.wr_id < self.done || c.wr_id >= self.done + n {
                return Err(self.fail(Error::internal(format!("rdma: completion of write {} outside the ring", c.wr_id))));
            }
            let slot = (c.wr_id % n) as usize;
            self.completed[slot] = true;
            if self.from[slot].take().is_some() {
                self.lent = self.lent.saturating_sub(1);
            }
        }
        while self.done < self.written && std::mem::take(&mut self.completed[(self.done % n) as usize]) {
            self.done += 1;
        }
        Ok(())
    }
}

impl Drop for RdmaSend {
    /// Waits (a bounded time) for writes in flight, which read the ring.
    fn drop(&mut self) {
        let t = Instant::now();
        while self.err.is_none() && self.done < self.posted && t.elapsed() < Duration::from_secs(10) {
            if self.progress().is_err() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Staged slots written into the receiver's, or messages lent from
/// registered memory; its completions are learned by polling a completion
/// queue, whose channel is a descriptor.
const OFFERS: Offers = Offers { lends: true, lands: false, pollable: true, staged: true, read_elsewhere: false };

/// How long taking back or forgetting a lent message waits for its write.
const LENT_WAIT: Duration = Duration::from_secs(10);

impl SendVerbs for RdmaSend {
    fn offers(&self) -> Offers {
        OFFERS
    }

    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn reserve(&mut self, bytes: usize, _spread: bool) -> Result<Option<*mut u8>> {
        if bytes > self.slot_bytes {
            return Err(Error::internal(format!("rdma: a message of {bytes} bytes in a slot of {}", self.slot_bytes)));
        }
        self.progress()?;
        let n = self.nslots as u64;
        if self.posted - self.done >= n || self.posted - self.credits() >= n {
            if self.remote.is_some() {
                self.setup.alive().map_err(|e| self.fail(e))?;
            }
            return Ok(None);
        }
        let slot = (self.posted % n) as usize;
        // SAFETY: slot `slot` of the ring, inside it.
        Ok(Some(unsafe { self.ring.ptr().add(slot * self.stride) }))
    }

    fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        self.publish(bytes, fp, None);
    }

    unsafe fn lend(&mut self, p: *const u8, bytes: usize, fp: &[u64; 4], _hold: bool) -> Result<()> {
        if bytes > self.slot_bytes {
            return Err(Error::internal(format!("rdma: a message of {bytes} bytes lent for a slot of {}", self.slot_bytes)));
        }
        let slot = (self.posted % self.nslots as u64) as usize;
        match self.link.spans().find(p, bytes).filter(|_| bytes > 0) {
            Some(mr) => self.publish(bytes, fp, Some((p as usize, mr.lkey))),
            None => {
                // SAFETY: `p` is valid for `bytes` bytes (lend's contract), which fit
                // the slot `reserve` returned (checked above); the two do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(p, self.ring.ptr().add(slot * self.stride), bytes) };
                self.publish(bytes, fp, None);
            }
        }
        Ok(())
    }

    fn lent(&self) -> usize {
        self.lent
    }

    fn reclaim(&mut self, p: *const u8, bytes: usize) {
        if self.lent > 0 {
            let (lo, hi) = (p as usize, p as usize + bytes);
            self.take_back(|a, len| a < hi && lo < a + len);
        }
    }

    fn forget_lent(&mut self) {
        self.take_back(|_, _| true);
        self.from.iter_mut().for_each(|f| *f = None);
        self.lent = 0;
    }

    fn flush(&mut self) -> Result<()> {
        self.progress()
    }

    fn announce_lost(&mut self, lost: usize) {
        self.setup.announce_lost(lost);
    }

    fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        Some((self.ring.ptr(), self.ring.len()))
    }
}

impl RdmaSend {
    /// Publishes the message of `bytes` bytes in the slot `reserve` returned,
    /// or lent `from` registered memory, as the next, with fingerprint `fp`.
    fn publish(&mut self, bytes: usize, fp: &[u64; 4], from: Option<(usize, u32)>) {
        let slot = (self.posted % self.nslots as u64) as usize;
        // SAFETY: the fingerprint goes right after the message, inside the slot (bytes <= slot_bytes <= stride - FP).
        unsafe {
            let at = self.ring.ptr().add(slot * self.stride + bytes);
            std::ptr::copy_nonoverlapping(fp.as_ptr().cast::<u8>(), at, FP);
        }
        self.lens[slot] = bytes;
        self.from[slot] = from;
        self.lent += usize::from(from.is_some());
        self.posted += 1;
        if let Err(e) = self.write_out() {
            drop(self.fail(e));
        }
    }

    /// Frees the memory of every lent message in flight that `hit` picks
    /// (by its address and bytes): one not yet written is copied into its
    /// slot, one being written is waited for.
    fn take_back(&mut self, hit: impl Fn(usize, usize) -> bool) {
        for seq in self.done..self.posted {
            let slot = (seq % self.nslots as u64) as usize;
            if !self.from[slot].is_some_and(|(a, _)| hit(a, self.lens[slot])) {
                continue;
            }
            if seq >= self.written {
                self.stage(slot);
            } else {
                self.wait_written(slot);
            }
        }
    }

    /// Copies the lent message of `slot`, not yet written, into the slot,
    /// to be written from there.
    fn stage(&mut self, slot: usize) {
        if let Some((a, _)) = self.from[slot].take() {
            // SAFETY: lent memory of `lens[slot]` bytes, valid until taken back
            // (lend's contract), copied into its own slot (which it fits).
            unsafe { std::ptr::copy_nonoverlapping(a as *const u8, self.ring.ptr().add(slot * self.stride), self.lens[slot]) };
            self.lent -= 1;
        }
    }

    /// Waits (at most `LENT_WAIT`) until the write of `slot`'s lent message
    /// has completed, or this end has failed, so that its memory may change.
    fn wait_written(&mut self, slot: usize) {
        let t = Instant::now();
        while self.from[slot].is_some() && self.err.is_none() {
            if self.poll().is_err() {
                break;
            }
            if t.elapsed() > LENT_WAIT {
                let e = Error::transport(format!("rdma: a write from lent memory did not complete in {LENT_WAIT:?}"));
                drop(self.fail(e));
                break;
            }
            std::hint::spin_loop();
        }
    }

    /// Writes every message posted and not yet written, once connected
    /// (until then they wait in their slots, as a socket's would in the
    /// kernel: a receiver that connects late holds no sender up).
    fn write_out(&mut self) -> Result<()> {
        let Some(remote) = self.remote else { return Ok(()) };
        while self.written < self.posted {
            let seq = self.written;
            let off = (seq % self.nslots as u64) as usize * self.stride;
            let (slot, ring) = (off / self.stride, self.ring.mr());
            let bytes = self.lens[slot];
            let to = Remote { addr: remote.addr + off as u64, rkey: remote.rkey };
            let whole = [Sge { addr: ring.addr + off, len: (bytes + FP) as u32, lkey: ring.lkey }];
            let lent = self.from[slot].map(|(a, lkey)| {
                [Sge { addr: a, len: bytes as u32, lkey }, Sge { addr: ring.addr + off + bytes, len: FP as u32, lkey: ring.lkey }]
            });
            let local: &[Sge] = lent.as_ref().map_or(&whole, |l| l);
            // SAFETY: the slot, and the lent memory (lend's contract, held until
            // its completion clears `from`), stay untouched until the write completes.
            unsafe { self.qps.of(seq).post_write(seq, local, to, Some(seq as u32), true) }?;
            self.written += 1;
        }
        Ok(())
    }

    #[cfg(test)]
    /// Messages posted so far (each one write with immediate).
    pub fn writes(&self) -> u64 {
        self.posted
    }

    #[cfg(test)]
    /// Forces its queue pair into the error state (fault injection).
    pub fn fail_queue_pair(&mut self) {
        self.qps.fail();
    }

    #[cfg(test)]
    /// Writes from now on name the receiver's slots by a wrong rkey
    /// (fault injection).
    pub fn corrupt_rkey(&mut self) {
        if let Some(r) = &mut self.remote {
            r.rkey ^= 0x5a5a;
        }
    }

}
