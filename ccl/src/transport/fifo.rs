//! A one-way FIFO of fixed-size slots: NCCL's STEPS.
//!
//! The sender fills the slot at `head % nslots`, writes the slot's header
//! line (length, the call's fingerprint) and publishes it by storing the
//! message's sequence number `head + 1` in that line (release); the
//! receiver polls the header line of the slot it expects (acquire), so a
//! small message costs it one cache line beside the data, which sits in the
//! line after (the pair a line prefetcher fetches together). It reduces or
//! copies straight out of the slot and hands it back by advancing `tail`
//! (release). The sender re-reads `tail` only when the slots it knows to
//! be free run out. Each word has one writer. Slots are 64-byte aligned so
//! any element type up to that alignment can be read in place. The memory
//! is one allocation for threads, a shared mapping for processes.

use crate::error::Result;
use super::doorbell::BellRef;
use super::sync::{publish, AtomicU32, AtomicU64, Ordering};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::Arc;

/// Alignment of every slot.
pub const SLOT_ALIGN: usize = 64;

/// Messages from this size on move around inside their slot
/// (`FifoMem::spread`).
pub const SPREAD_MIN: usize = 4096;

#[repr(C, align(64))]
struct Counter(AtomicU64);

/// Where a FIFO's memory comes from.
enum Backing {
    /// One heap allocation (ranks as threads).
    Heap(Layout),
    /// A shared mapping (ranks as processes); unmapped on drop.
    Map(#[allow(dead_code)] memmap2::MmapMut),
}

/// A slot's header line: written by the sender before it publishes.
#[repr(C, align(64))]
struct Header {
    /// The number of the message in the slot, counted from 1 (0: none yet).
    seq: AtomicU64,
    /// Bytes of data.
    len: AtomicU32,
    /// Where the data starts in the slot's data area (`FifoMem::spread`).
    off: AtomicU32,
    /// The call's fingerprint.
    fp: [AtomicU64; 4],
}

/// The shared part: the receiver's `tail`, then per slot a header line
/// and the data.
pub struct FifoMem {
    base: *mut u8,
    backing: Backing,
    nslots: usize,
    slot_bytes: usize,
    /// What the sender hands the receiver for the life of the connection
    /// (its device slots), kept until both ends are gone.
    attached: std::sync::Mutex<Option<Attachment>>,
    /// Under loom: the atomics, which cannot live in raw memory, and per
    /// slot a cell whose accesses stand for the data's.
    #[cfg(loom)]
    model: LoomModel,
}

#[cfg(loom)]
struct LoomModel {
    tail: Counter,
    headers: Box<[Header]>,
    data: Box<[loom::cell::UnsafeCell<()>]>,
}

#[cfg(loom)]
impl LoomModel {
    fn new(nslots: usize) -> Self {
        let header = |_| Header {
            seq: AtomicU64::new(0),
            len: AtomicU32::new(0),
            off: AtomicU32::new(0),
            fp: [0; 4].map(AtomicU64::new),
        };
        LoomModel {
            tail: Counter(AtomicU64::new(0)),
            headers: (0..nslots).map(header).collect(),
            data: (0..nslots).map(|_| loom::cell::UnsafeCell::new(())).collect(),
        }
    }
}

/// Something a sender keeps alive for its receiver.
pub type Attachment = Arc<dyn std::any::Any + Send + Sync>;

// SAFETY: the memory is only touched through atomics (tail, headers) or
// through slots that the head/tail protocol hands to exactly one side at a
// time; the raw pointer is owned and freed once, on drop.
unsafe impl Send for FifoMem {}
// SAFETY: as above: concurrent access is confined to atomics and to slots
// owned by one side.
unsafe impl Sync for FifoMem {}

impl FifoMem {
    /// A FIFO of `nslots` slots of `slot_bytes` each (rounded up to 64).
    pub fn new(nslots: usize, slot_bytes: usize) -> Option<Arc<Self>> {
        let (nslots, slot_bytes) = Self::shape(nslots, slot_bytes);
        let layout = Layout::from_size_align(Self::size(nslots, slot_bytes)?, SLOT_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (the tail counter at least).
        let base = unsafe { alloc_zeroed(layout) };
        if base.is_null() {
            return None;
        }
        Some(Arc::new(FifoMem {
            base,
            backing: Backing::Heap(layout),
            nslots,
            slot_bytes,
            attached: Default::default(),
            #[cfg(loom)]
            model: LoomModel::new(nslots),
        }))
    }

    /// A FIFO laid out in a shared mapping that is zero-filled when fresh
    /// (both ends map the same file); `None` if the mapping is too small.
    pub fn in_map(mut map: memmap2::MmapMut, nslots: usize, slot_bytes: usize) -> Option<Arc<Self>> {
        let (nslots, slot_bytes) = Self::shape(nslots, slot_bytes);
        if map.len() < Self::size(nslots, slot_bytes)? {
            return None;
        }
        let base = map.as_mut_ptr();
        if !(base as usize).is_multiple_of(SLOT_ALIGN) {
            return None;
        }
        Some(Arc::new(FifoMem {
            base,
            backing: Backing::Map(map),
            nslots,
            slot_bytes,
            attached: Default::default(),
            #[cfg(loom)]
            model: LoomModel::new(nslots),
        }))
    }

    fn shape(nslots: usize, slot_bytes: usize) -> (usize, usize) {
        (nslots.max(1), slot_bytes.max(1).div_ceil(SLOT_ALIGN) * SLOT_ALIGN)
    }

    /// Bytes of memory a FIFO of this shape needs.
    pub fn size(nslots: usize, slot_bytes: usize) -> Option<usize> {
        let (nslots, slot_bytes) = Self::shape(nslots, slot_bytes);
        Self::slots_off().checked_add(nslots.checked_mul(Self::stride(slot_bytes))?)
    }

    /// Bytes from one slot's header to the next: the header line and the
    /// data, padded so every header starts a 128-byte line pair.
    fn stride(slot_bytes: usize) -> usize {
        (SLOT_ALIGN + slot_bytes).div_ceil(2 * SLOT_ALIGN) * 2 * SLOT_ALIGN
    }

    fn slots_off() -> usize {
        std::mem::size_of::<Counter>()
    }

    #[cfg(loom)]
    fn header(&self, slot: usize) -> &Header {
        &self.model.headers[slot]
    }

    #[cfg(loom)]
    fn tail(&self) -> &AtomicU64 {
        &self.model.tail.0
    }

    #[cfg(not(loom))]
    fn header(&self, slot: usize) -> &Header {
        debug_assert!(slot < self.nslots);
        // SAFETY: `slot < nslots`, so the header line lies inside the
        // memory, 64-aligned (offsets are multiples of 64 from an aligned
        // base), zero-initialised; its atomics accept any bits.
        unsafe { &*(self.base.add(Self::slots_off() + slot * Self::stride(self.slot_bytes)) as *const Header) }
    }

    #[cfg(not(loom))]
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: offset 0 holds a zero-initialised, 64-aligned Counter that
        // lives as long as `self`; AtomicU64 accepts any bit pattern.
        unsafe { &(*(self.base as *const Counter)).0 }
    }

    /// Where in its slot message `seq` (counted from 0) of `bytes` bytes
    /// goes: a message of at most half a slot moves on by its own length
    /// (in lines) each time the ring comes back to that slot, so the lines
    /// it writes were last written `k` laps ago, not one, and have left
    /// both cores' private caches (writing lines that the other core still
    /// holds costs the writer a round trip each). Messages under
    /// [`SPREAD_MIN`] stay next to the header line, which the receiver
    /// polls and which the line-pair prefetcher fetches with the first
    /// data line.
    fn spread(&self, seq: u64, bytes: usize) -> usize {
        if bytes < SPREAD_MIN {
            return 0;
        }
        let span = bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let k = (self.slot_bytes / span) as u64;
        if k < 2 {
            return 0;
        }
        ((seq / self.nslots as u64) % k) as usize * span
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        let off = Self::slots_off() + (slot % self.nslots) * Self::stride(self.slot_bytes) + SLOT_ALIGN;
        // SAFETY: `slot % nslots < nslots`, so the data after that slot's
        // header stays inside the allocation.
        unsafe { self.base.add(off) }
    }

}

impl Drop for FifoMem {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: allocated in `new` with exactly this layout, freed once.
            unsafe { dealloc(self.base, layout) }
        }
    }
}

/// The sending end.
pub struct FifoSend {
    mem: Arc<FifoMem>,
    head: u64,
    /// Where the reserved slot's data starts.
    off: usize,
    /// `tail` as last read: slots below `tail + nslots` are free.
    tail: u64,
    receiver: BellRef,
}

/// The receiving end.
pub struct FifoRecv {
    mem: Arc<FifoMem>,
    tail: u64,
    sender: BellRef,
}

impl FifoSend {
    /// The sending end of `mem`; posting rings `receiver`.
    pub fn new(mem: Arc<FifoMem>, receiver: BellRef) -> Self {
        // every posted message was released before a new end attaches (a
        // FIFO gets its ends once, fresh), so the next message follows tail
        let tail = mem.tail().load(Ordering::Acquire);
        FifoSend { mem, head: tail, off: 0, tail, receiver }
    }

    /// Keeps `a` alive for as long as either end of this FIFO lives (a
    /// FIFO in this process's memory; a shared mapping cannot hold it).
    pub fn attach(&mut self, a: Attachment) {
        if let Ok(mut at) = self.mem.attached.lock() {
            *at = Some(a);
        }
    }

    /// Room for a message of `bytes` bytes (at most a slot) in the next
    /// free slot, if the receiver has released one: at the slot's start,
    /// or, to `spread`, where `FifoMem::spread` places it.
    pub fn reserve(&mut self, bytes: usize, spread: bool) -> Option<*mut u8> {
        let n = self.mem.nslots as u64;
        if self.head - self.tail >= n {
            self.tail = self.mem.tail().load(Ordering::Acquire);
        }
        if self.head - self.tail >= n {
            return None;
        }
        self.off = if spread { self.mem.spread(self.head, bytes.min(self.mem.slot_bytes)) } else { 0 };
        #[cfg(loom)]
        self.mem.model.data[(self.head % n) as usize].with_mut(|_| ());
        // SAFETY: `spread` keeps `off` + `bytes` within the slot's data.
        Some(unsafe { self.mem.slot_ptr((self.head % n) as usize).add(self.off) })
    }

    /// Publishes the reserved slot holding `bytes` bytes (at most what was
    /// reserved) of the call `fp`.
    pub fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        let h = self.mem.header((self.head % self.mem.nslots as u64) as usize);
        h.len.store(bytes as u32, Ordering::Relaxed);
        h.off.store(self.off as u32, Ordering::Relaxed);
        for (w, v) in h.fp.iter().zip(fp) {
            w.store(*v, Ordering::Relaxed);
        }
        self.head += 1;
        h.seq.store(self.head, publish());
        self.receiver.ring();
    }
}

impl FifoRecv {
    /// What the sender attached, if anything.
    pub fn attached(&self) -> Option<Attachment> {
        self.mem.attached.lock().ok().and_then(|a| a.clone())
    }

    /// The receiving end of `mem`; releasing rings `sender`.
    pub fn new(mem: Arc<FifoMem>, sender: BellRef) -> Self {
        let tail = mem.tail().load(Ordering::Acquire);
        FifoRecv { mem, tail, sender }
    }

    /// The oldest posted slot, its length and its call's fingerprint, if any.
    pub fn peek(&mut self) -> Option<(*const u8, usize, [u64; 4])> {
        let slot = (self.tail % self.mem.nslots as u64) as usize;
        let h = self.mem.header(slot);
        (h.seq.load(Ordering::Acquire) == self.tail + 1).then(|| {
            #[cfg(loom)]
            self.mem.model.data[slot].with(|_| ());
            let fp = h.fp.each_ref().map(|w| w.load(Ordering::Relaxed));
            let len = h.len.load(Ordering::Relaxed) as usize;
            // within the slot whatever the header says (the length is
            // checked against the step's by the caller)
            let off = (h.off.load(Ordering::Relaxed) as usize).min(self.mem.slot_bytes.saturating_sub(len));
            // SAFETY: `off` ≤ slot_bytes, so the pointer stays inside the slot's data.
            (unsafe { self.mem.slot_ptr(slot).add(off) } as *const u8, len, fp)
        })
    }

    /// Hands the peeked slot back to the sender.
    pub fn release(&mut self) {
        self.tail += 1;
        self.mem.tail().store(self.tail, publish());
        self.sender.ring();
    }
}

impl super::SendVerbs for FifoSend {
    fn offers(&self) -> super::Offers {
        super::Offers::default()
    }
    fn slot_bytes(&self) -> usize {
        self.mem.slot_bytes
    }
    #[inline]
    fn reserve(&mut self, bytes: usize, spread: bool) -> Result<Option<*mut u8>> {
        Ok(FifoSend::reserve(self, bytes, spread))
    }
    #[inline]
    fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        FifoSend::post(self, bytes, fp)
    }
    fn attach(&mut self, a: Attachment) -> bool {
        FifoSend::attach(self, a);
        true
    }
}

impl super::RecvVerbs for FifoRecv {
    fn offers(&self) -> super::Offers {
        super::Offers::default()
    }
    fn slot_bytes(&self) -> usize {
        self.mem.slot_bytes
    }
    #[inline]
    fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        Ok(FifoRecv::peek(self))
    }
    #[inline]
    fn release(&mut self) {
        FifoRecv::release(self)
    }
    fn attached(&self) -> Option<Attachment> {
        FifoRecv::attached(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::doorbell::Doorbell;

    #[test]
    fn slots_flow_in_order_and_respect_capacity() {
        let mem = FifoMem::new(4, 100).expect("alloc");
        assert_eq!(mem.slot_bytes, 128);
        let (b1, b2): (BellRef, BellRef) = (Arc::new(Doorbell::new()), Arc::new(Doorbell::new()));
        let mut tx = FifoSend::new(Arc::clone(&mem), Arc::clone(&b1));
        let mut rx = FifoRecv::new(mem, b2);
        for i in 0..4u8 {
            let p = tx.reserve(1 + i as usize, true).expect("free slot");
            assert_eq!(p as usize % SLOT_ALIGN, 0);
            // SAFETY: the reserved slot is ours until posted; 128 bytes.
            unsafe { p.write(i) };
            tx.post(1 + i as usize, &[i as u64; 4]);
        }
        assert!(tx.reserve(1, true).is_none(), "full after 4");
        for i in 0..4u8 {
            let (p, len, fp) = rx.peek().expect("posted");
            assert_eq!(fp, [i as u64; 4]);
            // SAFETY: the peeked slot is ours until released.
            assert_eq!(unsafe { p.read() }, i);
            assert_eq!(len, 1 + i as usize);
            rx.release();
        }
        assert!(rx.peek().is_none());
        assert!(tx.reserve(1, true).is_some());
    }

    #[test]
    fn messages_up_to_half_a_slot_move_on_each_lap_and_arrive_whole() {
        // 4 slots of 16 KiB: a 4 KiB message has 4 places in its slot, a
        // small one and a whole-slot one only the first
        let mem = FifoMem::new(4, 16 << 10).expect("alloc");
        let (b1, b2): (BellRef, BellRef) = (Arc::new(Doorbell::new()), Arc::new(Doorbell::new()));
        let mut tx = FifoSend::new(Arc::clone(&mem), b1);
        let mut rx = FifoRecv::new(Arc::clone(&mem), b2);
        let base = |slot: usize| mem.slot_ptr(slot) as usize;
        for (laps, bytes) in [(9, 4096), (3, SPREAD_MIN - 64), (3, 16 << 10), (6, 5000)] {
            // a 5000-byte message takes 5056 bytes (whole lines): 3 places
            let places = match bytes {
                4096 => 4,
                5000 => 3,
                _ => 1,
            };
            for m in 0..4 * laps {
                let seq = tx.head;
                let p = tx.reserve(bytes, true).expect("free slot");
                let slot = (seq % 4) as usize;
                let lap = (seq / 4) as usize;
                let span = bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
                assert_eq!(p as usize - base(slot), (lap % places) * span, "message {m} of {bytes} B");
                let data: Vec<u8> = (0..bytes).map(|_| rand::random()).collect();
                // SAFETY: the reserved room holds `bytes` bytes, ours until posted.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, bytes) };
                tx.post(bytes, &[seq; 4]);
                let (q, len, fp) = rx.peek().expect("posted");
                assert_eq!((q, len, fp), (p as *const u8, bytes, [seq; 4]));
                // SAFETY: the peeked slot holds `len` bytes until released.
                assert_eq!(unsafe { std::slice::from_raw_parts(q, len) }, &data[..]);
                rx.release();
            }
        }
        // a header whose place would run past the slot is read inside it
        let p = tx.reserve(64, true).expect("free slot");
        let slot = (tx.head % 4) as usize;
        tx.post(64, &[0; 4]);
        mem.header(slot).off.store(u32::MAX, Ordering::Relaxed);
        let (q, _, _) = rx.peek().expect("posted");
        assert_eq!(q as usize, base(slot) + (16 << 10) - 64);
        assert_eq!(p as usize, base(slot));
        rx.release();
        // not spread: every message at its slot's start, lap after lap
        for _ in 0..8 {
            let slot = (tx.head % 4) as usize;
            let p = tx.reserve(4096, false).expect("free slot");
            assert_eq!(p as usize, base(slot));
            tx.post(4096, &[0; 4]);
            assert_eq!(rx.peek().expect("posted").0, p as *const u8);
            rx.release();
        }
    }

    #[test]
    fn a_fifo_refuses_lent_memory_and_sends_nothing() {
        // a FIFO sends only from its slots: lending it a message is an
        // error, not a message dropped on the floor
        let mem = FifoMem::new(2, 64).expect("alloc");
        let (b1, b2): (BellRef, BellRef) = (Arc::new(Doorbell::new()), Arc::new(Doorbell::new()));
        use crate::transport::SendVerbs;
        let mut tx = crate::transport::SendConn::Fifo(FifoSend::new(Arc::clone(&mem), b1));
        let mut rx = FifoRecv::new(mem, b2);
        assert!(!tx.offers().lends);
        let data = [7u8; 16];
        tx.reserve(16, false).expect("reserve").expect("free slot");
        // SAFETY: `data` outlives the call, which sends nothing.
        let e = unsafe { tx.lend(data.as_ptr(), data.len(), &[0; 4], false) }.expect_err("refused");
        assert!(e.to_string().contains("sends only from its slots"), "{e}");
        assert_eq!(tx.lent(), 0);
        assert!(rx.peek().is_none(), "nothing was posted");
    }

    #[test]
    fn threads_pass_a_stream() {
        let mem = FifoMem::new(2, 64).expect("alloc");
        let (b1, b2): (BellRef, BellRef) = (Arc::new(Doorbell::new()), Arc::new(Doorbell::new()));
        let mut tx = FifoSend::new(Arc::clone(&mem), Arc::clone(&b1));
        let mut rx = FifoRecv::new(mem, b2);
        let n = 10_000u64;
        let t = std::thread::spawn(move || {
            for i in 0..n {
                loop {
                    if let Some(p) = tx.reserve(8, true) {
                        // SAFETY: reserved slot, 64-aligned, 64 bytes.
                        unsafe { (p as *mut u64).write(i) };
                        tx.post(8, &[0; 4]);
                        break;
                    }
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0;
        while next < n {
            if let Some((p, _, _)) = rx.peek() {
                // SAFETY: peeked slot holds the u64 written before the post.
                assert_eq!(unsafe { (p as *const u64).read() }, next);
                rx.release();
                next += 1;
            } else {
                std::thread::yield_now();
            }
        }
        t.join().expect("sender");
    }
}
