//! The receiving end of an RDMA connection: slots in registered memory
//! that the sender writes; one receive posted per slot, consumed by the
//! write with immediate that fills it; freed slots returned to the sender
//! by small writes into its credit word, batched.

use super::mem::Registered;
use super::qps::Qps;
use super::setup::{Hello, Setup};
use super::verbs::{Completion, Done, Remote, Sge, Status};
use super::{Link, FP};
use crate::error::{Error, Result};
use crate::transport::{Offers, RecvVerbs};
use std::sync::atomic::{AtomicU64, Ordering};

/// Credit writes in flight at most (each reads a word of its own).
const CREDIT_WORDS: usize = 8;

/// The receiving end.
pub struct RdmaRecv {
    qps: Qps,
    link: Link,
    setup: Box<Setup>,
    ring: Registered,
    /// Words the credit writes read, one per write in flight.
    words: Registered,
    nslots: usize,
    /// Bytes a message may have, and from one slot to the next.
    slot_bytes: usize,
    stride: usize,
    /// The sender's credit word, once it has spoken.
    credit_at: Option<Remote>,
    /// Messages arrived, freed (every one before the next to hand out),
    /// and freed as the sender last heard.
    arrived: u64,
    released: u64,
    reported: u64,
    /// The message each queue pair carries next (queue pair `j` carries
    /// `j`, `j + k`, ...).
    next: Vec<u64>,
    /// Credit writes posted and completed.
    credit_posted: u64,
    credit_done: u64,
    /// Each slot's arrived message, until freed: bytes, fingerprint.
    landed: Vec<Option<(usize, [u64; 4])>>,
    err: Option<Error>,
    comps: Vec<(usize, Completion)>,
}

impl RdmaRecv {
    pub(super) fn new(link: Link, mut qps: Qps, setup: Setup, nslots: usize, slot_bytes: usize) -> Result<Self> {
        let stride = (slot_bytes + FP).next_multiple_of(64);
        let ring = Registered::new(link.dev(), nslots * stride)?;
        let words = Registered::new(link.dev(), CREDIT_WORDS * 8)?;
        // a queue pair carries at most every k-th of the slots' messages
        let k = qps.len();
        for j in 0..k {
            for i in 0..nslots.div_ceil(k) {
                qps.of(j as u64).post_recv(i as u64)?;
            }
        }
        Ok(RdmaRecv {
            next: (0..k as u64).collect(),
            landed: vec![None; nslots],
            qps,
            link,
            setup: Box::new(setup),
            ring,
            words,
            nslots,
            slot_bytes,
            stride,
            credit_at: None,
            arrived: 0,
            released: 0,
            reported: 0,
            credit_posted: 0,
            credit_done: 0,
            err: None,
            comps: Vec::new(),
        })
    }

    fn fail(&mut self, e: Error) -> Error {
        let e = e.with_peer(self.link.peer);
        self.err.get_or_insert(e).clone()
    }

    /// Connects once the sender has spoken (then answers); then takes
    /// completions.
    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.err {
            return Err(e.clone());
        }
        if self.credit_at.is_none() {
            let heard = self.setup.heard_cut(self.nslots, self.stride, "sender");
            let Some(h) = heard.map_err(|e| self.fail(e))? else { return Ok(()) };
            self.qps.connect(&self.link, &h.qps).map_err(|e| self.fail(e))?;
            let at = Remote { addr: self.ring.mr().addr as u64, rkey: self.ring.mr().rkey };
            let me = Hello { qps: self.qps.infos(), at, nslots: self.nslots as u32, stride: self.stride as u32 };
            self.setup.say(&me).map_err(|e| self.fail(e))?;
            self.link.connected("recv");
            self.credit_at = Some(h.at);
        }
        self.comps.clear();
        self.qps.poll(&mut self.comps).map_err(|e| self.fail(e))?;
        for i in 0..self.comps.len() {
            let (j, c) = self.comps[i];
            self.complete(j, c)?;
        }
        self.report()
    }

    /// Takes completion `c` of queue pair `j`.
    fn complete(&mut self, j: usize, c: Completion) -> Result<()> {
        if c.status != Status::Success {
            return Err(self.fail(self.link.failed(c.status)));
        }
        let Done::Recv { imm, len } = c.done else {
            self.credit_done += 1;
            return Ok(());
        };
        let len = len as usize;
        let due = self.next[j];
        if imm != due as u32 || len < FP || len - FP > self.slot_bytes {
            let why = format!(
                "rdma: message {imm} of {len} B arrived where message {} (at most {} B) was due: late, duplicated or \
                 forged",
                due as u32, self.slot_bytes
            );
            return Err(self.fail(Error::transport(why)));
        }
        let slot = (due % self.nslots as u64) as usize;
        let mut fp = [0u64; 4];
        // SAFETY: the message's last FP bytes, inside its slot, written before
        // its completion came.
        unsafe {
            let at = self.ring.ptr().add(slot * self.stride + len - FP);
            std::ptr::copy_nonoverlapping(at, fp.as_mut_ptr().cast::<u8>(), FP);
        }
        self.landed[slot] = Some((len - FP, fp));
        self.arrived += 1;
        self.next[j] += self.qps.len() as u64;
        self.qps.of(j as u64).post_recv(due).map_err(|e| self.fail(e))
    }

    /// Tells the sender of freed slots: half a ring of them at once, or
    /// every one when the sender has used all it was last told of.
    fn report(&mut self) -> Result<()> {
        let n = self.nslots as u64;
        let unreported = self.released - self.reported;
        let exhausted = self.arrived >= self.reported + n;
        let inflight = (self.credit_posted - self.credit_done) as usize;
        let Some(at) = self.credit_at else { return Ok(()) };
        if unreported == 0 || !(unreported >= (n / 2).max(1) || exhausted) || inflight >= CREDIT_WORDS {
            return Ok(());
        }
        let w = (self.credit_posted % CREDIT_WORDS as u64) as usize * 8;
        // SAFETY: word `w` of `words`, read by no write in flight (at most CREDIT_WORDS are, each its own).
        let word = unsafe { AtomicU64::from_ptr(self.words.ptr().add(w).cast::<u64>()) };
        word.store(self.released, Ordering::Release);
        let local = Sge { addr: self.words.mr().addr + w, len: 8, lkey: self.words.mr().lkey };
        // SAFETY: the word stays unchanged until this write completes (CREDIT_WORDS later at the soonest).
        unsafe { self.qps.of(0).post_write(u64::MAX - self.credit_posted, &[local], at, None, true) }
            .map_err(|e| self.fail(e))?;
        self.credit_posted += 1;
        self.reported = self.released;
        Ok(())
    }

    #[cfg(test)]
    /// Credit writes posted so far.
    pub fn credit_writes(&self) -> u64 {
        self.credit_posted
    }

    #[cfg(test)]
    /// Forces its queue pair into the error state (fault injection).
    pub fn fail_queue_pair(&mut self) {
        self.qps.fail();
    }
}

/// Slots the sender writes; completions learned by polling a completion
/// queue, whose channel is a descriptor.
const OFFERS: Offers = Offers { lends: false, lands: false, pollable: true, staged: true, read_elsewhere: false };

impl RecvVerbs for RdmaRecv {
    fn offers(&self) -> Offers {
        OFFERS
    }

    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        let slot = (self.released % self.nslots as u64) as usize;
        if self.landed[slot].is_none() {
            self.progress()?;
        }
        match self.landed[slot] {
            // SAFETY: slot `slot` of the ring.
            Some((len, fp)) => Ok(Some((unsafe { self.ring.ptr().add(slot * self.stride) }, len, fp))),
            None => {
                if self.credit_at.is_some() {
                    self.setup.alive().map_err(|e| self.fail(e))?;
                }
                Ok(None)
            }
        }
    }

    fn release(&mut self) {
        let slot = (self.released % self.nslots as u64) as usize;
        if self.landed[slot].take().is_some() {
            self.released += 1;
            if let Err(e) = self.report() {
                drop(self.fail(e));
            }
        }
    }

    fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        Some((self.ring.ptr(), self.ring.len()))
    }
}
