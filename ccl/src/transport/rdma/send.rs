//! The sending end of an RDMA connection: slots staged in registered
//! memory here, each written into the receiver's slot of the same number
//! with one write with immediate (the immediate: the message's sequence
//! number); the receiver's credit word, written by the receiver, says how
//! many of its slots it has freed.

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
    err: Option<Error>,
    comps: Vec<(usize, Completion)>,
}

impl RdmaSend {
    pub(super) fn new(link: Link, qps: Qps, mut setup: Setup, nslots: usize, slot_bytes: usize) -> Result<Self> {
        let stride = (slot_bytes + FP).next_multiple_of(64);
        let ring = Registered::new(&link.dev, nslots * stride)?;
        let credit = Registered::new(&link.dev, 64)?;
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
            self.completed[(c.wr_id % n) as usize] = true;
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

/// Staged slots written into the receiver's; its completions are learned
/// by polling a completion queue, whose channel is a descriptor.
const OFFERS: Offers = Offers { lends: false, lands: false, pollable: true, staged: true, read_elsewhere: false };

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
        let slot = (self.posted % self.nslots as u64) as usize;
        // SAFETY: the fingerprint goes right after the message, inside the slot (bytes <= slot_bytes <= stride - FP).
        unsafe {
            let at = self.ring.ptr().add(slot * self.stride + bytes);
            std::ptr::copy_nonoverlapping(fp.as_ptr().cast::<u8>(), at, FP);
        }
        self.lens[slot] = bytes;
        self.posted += 1;
        if let Err(e) = self.write_out() {
            drop(self.fail(e));
        }
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
    /// Writes every message posted and not yet written, once connected
    /// (until then they wait in their slots, as a socket's would in the
    /// kernel: a receiver that connects late holds no sender up).
    fn write_out(&mut self) -> Result<()> {
        let Some(remote) = self.remote else { return Ok(()) };
        while self.written < self.posted {
            let seq = self.written;
            let off = (seq % self.nslots as u64) as usize * self.stride;
            let len = self.lens[off / self.stride] + FP;
            let local = Sge { addr: self.ring.mr().addr + off, len: len as u32, lkey: self.ring.mr().lkey };
            let to = Remote { addr: remote.addr + off as u64, rkey: remote.rkey };
            // SAFETY: the slot stays untouched until its write completes (`done` passes it).
            unsafe { self.qps.of(seq).post_write(seq, &[local], to, Some(seq as u32), true) }?;
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
