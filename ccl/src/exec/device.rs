//! The executor's device side: a call's GPU, stream and kernels, and each
//! connection's device slots and flags.
//!
//! A connection used by a device call starts with one hello message from
//! the sender (in a host slot, under [`HELLO`] instead of a call's
//! fingerprint) saying where its device slots are: an IPC handle of the
//! sender's slot memory (mapped once by a receiver in another process of
//! the host), the raw address (a receiver in the same process), or
//! "staged" (a tcp connection: bytes travel in the host slots).
//!
//! Data message `k` of the connection sits in device slot `k % nslots`.
//! Within a host the hand-off happens on the GPUs: after the slots come
//! their flags, one per slot, `EMPTY` or `FULL`. The sender's stream
//! waits for its slot's flag to be empty, fills the slot and sets the flag
//! full; the receiver's stream waits for it to be full, reads the slot
//! (its kernels) and sets it empty. Each slot is thus a queue of one
//! between two streams that run in order, and a call leaves every flag as
//! it found it, so a captured graph replays the same operations correctly
//! (no count is baked into them). The hosts only queue that work, and
//! exchange one message per call and connection (the call's fingerprint,
//! checked by the receiver). A staged connection hands its slots over on
//! the host, after synchronising the stream, as the socket needs the
//! bytes there.

use crate::error::{Error, ErrorKind, Result};
use crate::gpu::watch::RELEASED;
use crate::gpu::{Device, Until};
use crate::transport::fifo::Attachment;
use std::sync::Arc;

/// What stands in a host slot's fingerprint for a device hello.
pub const HELLO: [u64; 4] = [0x6363_6c2d_6770_7531; 4];
const MAGIC: &[u8; 8] = b"ccl-gpu1";
/// Bytes of a hello.
const HELLO_BYTES: usize = 128;
/// Bytes of each slot's flag (a line of its own).
const FLAG_BYTES: usize = 64;
/// A slot's flag: the slot may be filled.
pub(crate) const EMPTY: u64 = 0;
/// A slot's flag: the slot holds a message not yet read.
pub(crate) const FULL: u64 = 1;
/// What a sender's stream waits for before it fills a slot: empty (or
/// released by the host, [`RELEASED`]).
pub(crate) const UNTIL_EMPTY: Until = Until::SomeClear(FULL);
/// What a receiver's stream waits for before it reads a slot: full (or released).
pub(crate) const UNTIL_FULL: Until = Until::SomeSet(FULL | RELEASED);

/// The flag of slot `i` of a connection's device memory at `base`; slot
/// `nslots`'s is the connection's poison mark ([`POISONED`]).
///
/// [`POISONED`]: crate::gpu::watch::POISONED
fn flag(base: u64, nslots: usize, slot_bytes: usize, i: usize) -> u64 {
    base + ((nslots * slot_bytes).next_multiple_of(FLAG_BYTES) + i * FLAG_BYTES) as u64
}

/// Owned device memory, freed on drop.
#[derive(Debug)]
pub(crate) struct DevMem {
    dev: Arc<dyn Device>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DevMem {
    pub fn new(dev: &Arc<dyn Device>, bytes: usize) -> Result<Self> {
        Ok(DevMem { dev: Arc::clone(dev), ptr: dev.alloc(bytes.max(1))?, bytes })
    }

    /// The device it is memory of.
    pub fn dev(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` on this device and dropped once.
        unsafe { self.dev.free(self.ptr) };
    }
}

/// Host staging memory page-locked for a GPU, unlocked on drop (before
/// the connection that owns the memory is dropped: see `Conns`).
#[derive(Debug)]
pub(crate) struct Pinned {
    dev: Arc<dyn Device>,
    ptr: usize,
}

impl Pinned {
    /// Pins `mem` if the driver allows (else the staging stays pageable, slower but correct).
    ///
    /// # Safety
    /// `mem` stays allocated for the life of the returned guard.
    pub unsafe fn new(dev: &Arc<dyn Device>, mem: Option<(*mut u8, usize)>) -> Option<Self> {
        let (ptr, bytes) = mem?;
        // SAFETY: forwarded from this function's contract.
        unsafe { dev.pin(ptr, bytes) }.ok().map(|()| Pinned { dev: Arc::clone(dev), ptr: ptr as usize })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: pinned in `new`; the memory outlives the guard (its owner drops after it).
        unsafe { self.dev.unpin(self.ptr as *mut u8) };
    }
}

/// The sending side of a connection's device slots.
#[derive(Debug)]
pub(crate) struct DevSend {
    /// `nslots` slots (IPC and same-process) or one staging slot (staged).
    pub mem: Arc<DevMem>,
    pub nslots: usize,
    pub slot_bytes: usize,
    pub staged: bool,
    /// Data messages sent.
    pub count: u64,
    /// The socket's staging slots, page-locked (staged).
    pub pinned: Option<Pinned>,
}

impl DevSend {
    /// The device slot of the next data message.
    pub fn slot(&self) -> u64 {
        let i = if self.staged { 0 } else { (self.count % self.nslots as u64) as usize };
        self.mem.ptr + (i * self.slot_bytes) as u64
    }

    /// The flag of the next data message's slot, unless staged.
    pub fn flag(&self) -> Option<u64> {
        let i = (self.count % self.nslots as u64) as usize;
        (!self.staged).then(|| flag(self.mem.ptr, self.nslots, self.slot_bytes, i))
    }

    /// The connection's poison mark, unless staged.
    pub fn mark(&self) -> Option<u64> {
        (!self.staged).then(|| flag(self.mem.ptr, self.nslots, self.slot_bytes, self.nslots))
    }

    /// Whether the receiver has read every message sent (a receiver in
    /// another process reads the slots until then).
    pub fn drained(&self) -> bool {
        let full = |i| self.mem.dev.read_word(flag(self.mem.ptr, self.nslots, self.slot_bytes, i)).map(|w| w & FULL);
        self.staged || (0..self.nslots).all(|i| full(i).is_ok_and(|f| f == 0))
    }
}

/// Where a receiver finds the sender's slots.
#[derive(Debug)]
pub(crate) enum Source {
    /// The sender's slots mapped into this process by IPC.
    Imported(Arc<dyn Device>, u64),
    /// The sender's slots, same process (kept alive while read).
    Shared(Arc<DevMem>),
    /// Bytes come in the host slot; copied to this staging slot first.
    Staged(DevMem),
}

/// The receiving side of a connection's device slots.
#[derive(Debug)]
pub(crate) struct DevRecv {
    pub source: Source,
    pub nslots: usize,
    pub slot_bytes: usize,
    /// Data messages received.
    pub count: u64,
    /// The socket's staging slots, page-locked (staged).
    pub pinned: Option<Pinned>,
}

impl DevRecv {
    /// The device address of the next data message.
    pub fn slot(&self) -> u64 {
        let at = |base: u64| base + ((self.count % self.nslots as u64) as usize * self.slot_bytes) as u64;
        match &self.source {
            Source::Imported(_, p) => at(*p),
            Source::Shared(m) => at(m.ptr),
            Source::Staged(m) => m.ptr,
        }
    }

    /// The flag of the next data message's slot (the sender's), unless staged.
    pub fn flag(&self) -> Option<u64> {
        let base = match &self.source {
            Source::Imported(_, p) => *p,
            Source::Shared(m) => m.ptr,
            Source::Staged(_) => return None,
        };
        Some(flag(base, self.nslots, self.slot_bytes, (self.count % self.nslots as u64) as usize))
    }

    /// The connection's poison mark (in the sender's memory), unless staged.
    pub fn mark(&self) -> Option<u64> {
        let base = match &self.source {
            Source::Imported(_, p) => *p,
            Source::Shared(m) => m.ptr,
            Source::Staged(_) => return None,
        };
        Some(flag(base, self.nslots, self.slot_bytes, self.nslots))
    }
}

impl Drop for DevRecv {
    fn drop(&mut self) {
        if let Source::Imported(dev, p) = &self.source {
            // SAFETY: mapped by `import` in `accept`, unmapped once.
            unsafe { dev.unimport(*p) };
        }
    }
}

impl DevSend {
    /// Allocates the slots and writes the hello into `host_slot` (at least
    /// [`HELLO_BYTES`]); returns the bytes to post.
    pub fn open(
        dev: &Arc<dyn Device>,
        staged: bool,
        nslots: usize,
        slot_bytes: usize,
        host_slot: &mut [u8],
    ) -> Result<(Self, usize)> {
        if host_slot.len() < HELLO_BYTES {
            return Err(Error::internal("host slots too small for a device hello"));
        }
        let (n, flags) = if staged { (1, 0) } else { (nslots, (nslots + 1) * FLAG_BYTES) };
        let mem = Arc::new(DevMem::new(dev, (n * slot_bytes).next_multiple_of(FLAG_BYTES) + flags)?);
        let handle = if staged { [0u8; 64] } else { dev.export(mem.ptr)? };
        for i in (0..=nslots).filter(|_| !staged) {
            // SAFETY: aligned words of the fresh allocation, which nothing
            // has queued work on yet.
            unsafe { dev.write_word(flag(mem.ptr, nslots, slot_bytes, i), EMPTY)? };
        }

        let h = &mut host_slot[..HELLO_BYTES];
        h.fill(0);
        h[..8].copy_from_slice(MAGIC);
        h[8] = staged as u8;
        h[16..24].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        h[24..32].copy_from_slice(&mem.ptr.to_le_bytes());
        h[32..40].copy_from_slice(&(nslots as u64).to_le_bytes());
        h[40..48].copy_from_slice(&(slot_bytes as u64).to_le_bytes());
        h[64..128].copy_from_slice(&handle);
        Ok((DevSend { mem, nslots, slot_bytes, staged, count: 0, pinned: None }, HELLO_BYTES))
    }
}

impl DevRecv {
    /// Reads a hello (`fp` is the host slot's fingerprint) and maps the
    /// sender's slots; `ours` describes this rank's call for a mismatch;
    /// `attached` is what a sender in this process attached to the
    /// connection (its slots, kept alive while this side reads them).
    pub fn accept(
        dev: &Arc<dyn Device>,
        hello: &[u8],
        fp: [u64; 4],
        (ours, slots): (String, crate::transport::Geometry),
        attached: Option<Attachment>,
    ) -> Result<Self> {
        if fp != HELLO || hello.len() != HELLO_BYTES || &hello[..8] != MAGIC {
            let theirs = crate::plan::fingerprint::Fingerprint::describe(&fp);
            return Err(Error::new(ErrorKind::Mismatch { ours, theirs: format!("{theirs} on host memory") }));
        }
        let word = |i: usize| u64::from_le_bytes(hello[i..i + 8].try_into().unwrap_or_default());
        let (staged, pid, ptr) = (hello[8] != 0, word(16), word(24));
        let (nslots, slot_bytes) = (word(32).max(1) as usize, word(40) as usize);
        if !staged && (nslots, slot_bytes) != (slots.nslots, slots.slot_bytes) {
            // both sides cut the call by their slots: they must agree
            return Err(Error::new(ErrorKind::Mismatch {
                ours: format!("{ours}, {} device slots of {} B", slots.nslots, slots.slot_bytes),
                theirs: format!(
                    "{nslots} device slots of {slot_bytes} B (CCL_GPU_SLOT=auto sizes them by each GPU's memory: \
                     set it on every rank where GPUs differ)"
                ),
            }));
        }
        let source = if staged {
            Source::Staged(DevMem::new(dev, slot_bytes)?)
        } else if let Some(m) = attached.and_then(|a| a.downcast::<DevMem>().ok()).filter(|m| m.ptr == ptr) {
            // a sender of this process, maybe on another GPU: its kernels read there
            dev.reach(m.dev().as_ref())?;
            Source::Shared(m)
        } else if pid == u64::from(std::process::id()) {
            return Err(Error::internal("a device hello from this process without its slots attached"));
        } else {
            let handle: [u8; 64] = hello[64..128].try_into().unwrap_or([0; 64]);
            Source::Imported(Arc::clone(dev), dev.import(&handle)?)
        };
        Ok(DevRecv { source, nslots, slot_bytes, count: 0, pinned: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_maps_the_senders_slots_and_a_host_call_is_a_mismatch() {
        let dev = crate::gpu::Gpu::emulated(7).dev;
        let mut host = vec![0u8; 4096];
        let (mut s, n) = DevSend::open(&dev, false, 8, 1024, &mut host).expect("must succeed");
        let a: Attachment = Arc::clone(&s.mem) as Attachment;
        let slots = crate::transport::Geometry { nslots: 8, slot_bytes: 1024 };
        let mut r = DevRecv::accept(&dev, &host[..n], HELLO, ("x".into(), slots), Some(a)).expect("must succeed");
        assert!(matches!(&r.source, Source::Shared(m) if m.ptr == s.mem.ptr));
        for k in 0..20 {
            assert_eq!(s.slot(), r.slot(), "message {k}");
            assert_eq!(s.slot(), s.mem.ptr + (k % 8) * 1024);
            s.count += 1;
            r.count += 1;
        }
        let (st, n) = DevSend::open(&dev, true, 8, 1024, &mut host).expect("must succeed");
        let r = DevRecv::accept(&dev, &host[..n], HELLO, ("x".into(), slots), None).expect("must succeed");
        assert!(matches!(r.source, Source::Staged(_)) && st.staged);
        let e = DevRecv::accept(&dev, &host[..n], [1, 2, 3, 4], ("all_reduce of f32@gpu".into(), slots), None)
            .expect_err("must fail");
        assert!(e.to_string().contains("this rank called all_reduce of f32@gpu but the peer called"), "{e}");
        // a sender whose GPU sized its slots otherwise (CCL_GPU_SLOT=auto on another GPU)
        let (big, n) = DevSend::open(&dev, false, 8, 2048, &mut host).expect("must succeed");
        let a: Attachment = Arc::clone(&big.mem) as Attachment;
        let e = DevRecv::accept(&dev, &host[..n], HELLO, ("x".into(), slots), Some(a)).expect_err("must fail");
        let m = e.to_string();
        assert!(m.contains("8 device slots of 1024 B") && m.contains("8 device slots of 2048 B (CCL_GPU_SLOT"), "{m}");
    }
}
