//! Shared buffers: memory every rank of a host maps, so that an all-reduce
//! on it reads its peers' inputs and writes their outputs directly, with no
//! slots in between (NCCL's `ncclMemAlloc` and buffer registration, in one
//! collective call: [`Communicator::alloc_shared`](super::Communicator::alloc_shared)).
//!
//! Each rank reduces its share of the elements from every rank's input and
//! writes the result into every rank's output: it reads and writes each of
//! its share's bytes once per rank, as one memcpy of the buffer would. Two
//! small all-reduces of the call's description frame the work: the first
//! checks that every rank passed the same allocation, count, type and
//! operator, and lets no rank read an input before its owner has entered
//! the call; the second lets no rank return before every output is
//! written. Both go through the connections like any call, so deadlines,
//! lost peers and mismatched calls fail as they do there.

use super::group::{Group, Inner};
use crate::config::LogLevel;
use crate::error::{Error, Result};
use crate::exec::fingerprint::NameHashes as Names;
use crate::op::ReduceOp;
use crate::transport::shm::DIR;
use crate::{Max, Min, Reduce};
use memmap2::{MmapOptions, MmapRaw};
use std::fs::OpenOptions;
use std::marker::PhantomData;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Files created by this process so far: numbers their names.
static CREATED: AtomicU64 = AtomicU64::new(0);

/// Elements a rank reduces and then copies out to its peers at a time:
/// small enough that the copies read the result from the L1/L2 cache.
const BLOCK_BYTES: usize = 32 << 10;

/// Calls smaller than this run through the connections instead: below it
/// the two framing all-reduces cost what the slots save (2 ranks here,
/// 3 alternating runs: at 4 KiB both ways took 1-3 µs; at 16 KiB directly
/// 1.7-2.4 µs, through slots 3.4-16 µs).
pub(crate) const DIRECT_MIN_BYTES: usize = 16 << 10;

/// The memory of one `alloc_shared` call on one rank: its own buffer and,
/// where every rank of the group can map every other's, all of them.
#[doc(hidden)]
pub struct Window {
    /// The group it was allocated on (only that group's calls use it directly).
    group: Weak<Inner>,
    /// Its number among the group's allocations: equal on every rank.
    number: u64,
    /// Bytes of each rank's buffer.
    bytes: usize,
    /// This rank's buffer.
    own: MmapRaw,
    /// Every rank's buffer as mapped here, by rank (this rank's own
    /// included); empty unless every rank mapped every other's.
    peers: Vec<MmapRaw>,
    /// Calls that wrote into this window directly.
    calls: AtomicU64,
}

impl Window {
    /// Whether calls of `group` on this window (and on `input`'s, when
    /// given) can read and write the peers' buffers directly.
    pub(crate) fn direct_for(&self, group: &Group, input: Option<&Window>) -> bool {
        let mine = |w: &Window| !w.peers.is_empty() && Weak::ptr_eq(&w.group, &Arc::downgrade(&group.inner));
        mine(self) && input.is_none_or(mine)
    }

    /// Rank `r`'s buffer, as mapped in this process.
    fn of(&self, r: usize) -> *mut u8 {
        self.peers[r].as_mut_ptr()
    }
}

/// A buffer of `T` in memory every rank of the host maps: see
/// [`Communicator::alloc_shared`](super::Communicator::alloc_shared). It
/// dereferences to `[T]` and is passed to collectives like a `Vec<T>`.
pub struct SharedBuffer<T> {
    win: Arc<Window>,
    len: usize,
    _t: PhantomData<T>,
}

// SAFETY: a SharedBuffer owns its elements as a Vec does (peers touch them
// only inside calls that borrow it), so it is Send/Sync when T is.
unsafe impl<T: Send> Send for SharedBuffer<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for SharedBuffer<T> {}

impl<T> SharedBuffer<T> {
    pub(crate) fn window(&self) -> &Window {
        &self.win
    }
}

impl<T: Reduce> std::ops::Deref for SharedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` elements (at least one page, so
        // aligned for any T), lives as long as `self`, and any bit pattern
        // is a valid `T: Reduce`; peers write it only inside a call that
        // borrows `self` mutably.
        unsafe { std::slice::from_raw_parts(self.win.own.as_ptr() as *const T, self.len) }
    }
}

impl<T: Reduce> std::ops::DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`; `&mut self` makes this the only access here.
        unsafe { std::slice::from_raw_parts_mut(self.win.own.as_mut_ptr() as *mut T, self.len) }
    }
}

impl<T: Reduce + std::fmt::Debug> std::fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer").field("len", &self.len).field("direct", &!self.win.peers.is_empty()).finish()
    }
}

/// Maps `f` (whole), with every page in place if `populate`: a rank
/// touches all of its own buffer but only its share of each peer's.
fn map(f: &std::fs::File, populate: bool) -> std::io::Result<MmapRaw> {
    let mut o = MmapOptions::new();
    if populate {
        o.populate();
    }
    o.map_raw(f)
}

/// This process's file for a buffer: swept like the transport's files once
/// its owner has exited (`-p<pid>`).
fn path(pid: u64, number: u64) -> PathBuf {
    PathBuf::from(format!("{DIR}/ccl-w{pid}-{number}-p{pid}"))
}

/// Allocates `len` zeroed elements on every rank of `group` (a collective
/// call); see [`Communicator::alloc_shared`](super::Communicator::alloc_shared).
/// Errors name the allocation's number (`alloc_shared #N`), or the call
/// inside it that failed.
pub(crate) fn alloc<T: Reduce>(group: &Group, len: usize) -> Result<SharedBuffer<T>> {
    let number = group.inner.windows.fetch_add(1, Ordering::Relaxed);
    alloc_numbered(group, len, number).map_err(|e| e.in_call("alloc_shared", number).at_rank(group.rank()))
}

fn alloc_numbered<T: Reduce>(group: &Group, len: usize, number: u64) -> Result<SharedBuffer<T>> {
    let inner = &group.inner;
    let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| Error::invalid("too large"))?;
    let pid = u64::from(std::process::id());
    let created = CREATED.fetch_add(1, Ordering::Relaxed);
    let file = path(pid, created);
    // every rank's file must be on one host, and shared memory allowed
    let local = inner.hosts.groups().len() == 1 && !inner.config.shm_disable;
    let shared = || -> std::io::Result<MmapRaw> {
        let f = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&file)?;
        f.set_len(bytes.max(1) as u64)?;
        map(&f, true)
    };
    let (own, made) = match local.then(shared) {
        Some(Ok(m)) => (m, true),
        other => {
            let _ = std::fs::remove_file(&file);
            if let (Some(Err(e)), true) = (other, inner.config.debug >= LogLevel::Warn) {
                // the others are waiting for this rank's part: go on without it
                eprintln!(
                    "ccl: rank {}: alloc_shared #{number}: {}: {e}; the buffer is private memory and all-reduces on \
                     it go through the connections",
                    inner.rank,
                    file.display()
                );
            }
            let m = MmapOptions::new()
                .len(bytes.max(1))
                .map_anon()
                .map_err(|e| Error::transport(format!("anonymous memory: {e}")))?;
            (MmapRaw::from(m), false)
        }
    };
    let removed = scopeguard(&file, made);
    // who made which file, and how large
    let me = [if made { pid } else { 0 }, created, bytes as u64];
    let mut all = vec![0u64; 3 * inner.size];
    group.typed::<u64>().all_gather(&me, &mut all)?;
    let mut peers = Vec::new();
    if all.chunks(3).all(|c| c[0] != 0 && c[2] == bytes as u64) {
        // (this rank's own too: its entry names its file)
        for c in all.chunks(3) {
            match OpenOptions::new().read(true).write(true).open(path(c[0], c[1])).and_then(|f| map(&f, false)) {
                Ok(m) => peers.push(m),
                Err(_) => break,
            }
        }
    }
    // every rank has mapped what it could: all or none go direct
    let mut ok = [u64::from(peers.len() == inner.size)];
    group.typed::<u64>().all_reduce(&mut ok, Min)?;
    drop(removed);
    if ok[0] == 0 {
        peers.clear();
    }
    let win = Window { group: Arc::downgrade(inner), number, bytes, own, peers, calls: AtomicU64::new(0) };
    Ok(SharedBuffer { win: Arc::new(win), len, _t: PhantomData })
}

/// Removes `file` (if `made`) when dropped: once every rank has mapped it,
/// or when allocation fails part way.
fn scopeguard(file: &std::path::Path, made: bool) -> impl Drop + '_ {
    struct Remove<'a>(&'a std::path::Path, bool);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            if self.1 {
                let _ = std::fs::remove_file(self.0);
            }
        }
    }
    Remove(file, made)
}

/// A word of a framing call: a type of its own, so that where a peer ran
/// the same call through the connections instead, the mismatch error
/// names this one for what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(transparent)]
struct Frame(u64);

// SAFETY: a u64: plain data, every bit pattern valid.
unsafe impl Reduce for Frame {
    const NAME: &'static str = crate::exec::fingerprint::SHARED_FRAME;
}

impl ReduceOp<Frame> for Max {
    fn combine(a: Frame, b: Frame) -> Frame {
        a.max(b)
    }
}

/// Every rank's description of the call, spread so that one all-reduce
/// (max) shows whether all ranks agree: each value next to its complement.
fn framing<T: Reduce, O: ReduceOp<T>>(input: Option<&Window>, output: &Window, count: usize) -> [Frame; 8] {
    let kinds = (u64::from(Names::<T, O>::TYPE) << 32) | u64::from(Names::<T, O>::OP);
    let words = [input.map_or(u64::MAX, |w| w.number), output.number, count as u64, kinds];
    let mut v = [Frame(0); 8];
    for (i, w) in words.iter().enumerate() {
        v[2 * i] = Frame(*w);
        v[2 * i + 1] = Frame(!w);
    }
    v
}

/// The framing all-reduce: numbered `seq`, like the call it frames.
fn frame(group: &Group, seq: u64, timeout: Option<std::time::Duration>, mut v: [Frame; 8]) -> Result<()> {
    let want = v;
    let call = super::group::Call {
        coll: crate::algo::Coll::AllReduce,
        count: v.len(),
        root: 0,
        input: std::ptr::NonNull::<Frame>::dangling().as_ptr(),
        output: v.as_mut_ptr(),
        in_place: true,
        timeout,
        device: None,
    };
    // SAFETY: `v` lives on this frame for the whole blocking call.
    unsafe { group.run_numbered::<Frame, Max>(call, seq) }?;
    if v != want {
        return Err(Error::invalid(
            "the ranks passed shared buffers of different alloc_shared calls, or different counts, types or \
             operators: every rank must pass its buffer of the same allocation",
        ));
    }
    Ok(())
}

/// All-reduce number `seq` of `count` elements from every rank's `input`
/// (in place: `output`) into every rank's `output`, reading and writing the
/// peers' buffers directly. The windows must be direct for `group`.
pub(crate) fn all_reduce<T: Reduce, O: ReduceOp<T>>(
    group: &Group,
    seq: u64,
    timeout: Option<std::time::Duration>,
    input: Option<&Window>,
    output: &Window,
    count: usize,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let (n, me) = (group.size(), group.rank());
    let need = count.saturating_mul(elem);
    if need > output.bytes || input.is_some_and(|w| need > w.bytes) {
        return Err(Error::internal("shared buffer smaller than its count"));
    }
    let v = framing::<T, O>(input, output, count);
    frame(group, seq, timeout, v)?;
    let src = input.unwrap_or(output);
    let share = crate::algo::part::split(0..count, n).swap_remove(me);
    let block = (BLOCK_BYTES / elem.max(1)).max(1);
    // large outputs out of place: reduce a block into memory that stays in
    // L1, then stream it to every output, so that no output line is read
    // before it is overwritten (in place, the lines were just read)
    let nt = group.config().nt_stores_min;
    let around = input.is_some() && nt > 0 && need >= nt && std::mem::align_of::<T>() <= 64;
    #[repr(C, align(64))]
    struct Block([u8; BLOCK_BYTES]);
    let mut scratch = around.then(|| Box::new(Block([0; BLOCK_BYTES])));
    let mut at = share.start;
    while at < share.end {
        let len = block.min(share.end - at);
        let elems = |w: &Window, r: usize| {
            // SAFETY: every rank's buffer holds `count` elements (checked
            // above and by the framing call: same allocation and count on
            // every rank), mapped here for the window's life; this range
            // lies in this rank's share, which no other rank touches during
            // the call, and the framing calls order the owners' own
            // accesses before and after.
            unsafe { (w.of(r) as *mut T).add(at) }
        };
        let tmp = match scratch.as_mut() {
            // SAFETY: BLOCK_BYTES initialised bytes, 64-byte aligned (as
            // `T` is, checked above), hold `len` ≤ BLOCK_BYTES / size elements;
            // any bit pattern is a valid `T: Reduce`.
            Some(b) => unsafe { std::slice::from_raw_parts_mut(b.0.as_mut_ptr() as *mut T, len) },
            // SAFETY: see `elems`; this output range is written by this rank alone.
            None => unsafe { std::slice::from_raw_parts_mut(elems(output, me), len) },
        };
        let read = |r: usize| {
            // SAFETY: see `elems`; an input range that is not `tmp`.
            unsafe { std::slice::from_raw_parts(elems(src, r) as *const T, len) }
        };
        let mut others = (0..n).filter(|&r| r != me);
        if let Some(first) = others.next() {
            if input.is_some() {
                O::reduce3(tmp, read(me), read(first));
            } else {
                O::reduce_into(tmp, read(first));
            }
        }
        for r in others {
            O::reduce_into(tmp, read(r));
        }
        O::finish(tmp, n);
        for r in (0..n).filter(|&r| around || r != me) {
            // SAFETY: see `elems`: rank r's output range of this rank's share.
            let dst = unsafe { std::slice::from_raw_parts_mut(elems(output, r), len) };
            if around {
                ccl_kernels::copy_around_cache(dst, tmp);
            } else {
                dst.copy_from_slice(tmp);
            }
        }
        at += len;
    }
    frame(group, seq, timeout, v)?;
    if output.calls.fetch_add(1, Ordering::Relaxed) == 0 && group.config().debug >= LogLevel::Info {
        eprintln!("ccl: rank {me}: all_reduce #{seq} of {need} bytes and later ones on these buffers: directly through shared memory");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{run_local, LocalJob};
    use crate::Sum;

    /// Rank r's input: fresh random values, small integers so that sums are
    /// exact in any order.
    fn draw(len: usize) -> Vec<f32> {
        (0..len).map(|_| f32::from(rand::random::<u8>() % 7)).collect()
    }

    /// Runs an in-place and an out-of-place all-reduce of `count` on shared
    /// buffers on `job` of `n` ranks; per rank: whether both were right,
    /// and how many calls went directly.
    fn on(n: usize, job: LocalJob, count: usize) -> Vec<(bool, u64)> {
        let ins: Vec<Vec<f32>> = (0..n).map(|_| draw(count)).collect();
        let want: Vec<f32> = (0..count).map(|i| ins.iter().map(|v| v[i]).sum()).collect();
        job.run(|g| {
            let c = g.typed::<f32>();
            let mut a = c.alloc_shared(count).expect("alloc");
            let mut b = c.alloc_shared(count).expect("alloc");
            a.copy_from_slice(&ins[g.rank()]);
            c.all_reduce_into(&a, &mut b, Sum).expect("out of place");
            c.all_reduce(&mut a, Sum).expect("in place");
            let right = *a == want[..] && *b == want[..];
            (right, a.window().calls.load(Ordering::Relaxed) + b.window().calls.load(Ordering::Relaxed))
        })
    }

    #[test]
    fn large_all_reduces_on_one_host_go_directly_and_small_ones_through_slots() {
        // (and, out of place, written around the cache as large outputs are)
        let streamed = crate::Config { nt_stores_min: 1, ..crate::Config::default() };
        for n in 2..=5 {
            let big = (DIRECT_MIN_BYTES / 4) * 3 + n; // not a multiple of n
            assert_eq!(on(n, LocalJob::new(n), big), vec![(true, 2); n], "{n} ranks");
            assert_eq!(
                on(n, LocalJob::new(n).config(streamed.clone()), big),
                vec![(true, 2); n],
                "{n} ranks, streamed"
            );
            assert_eq!(on(n, LocalJob::new(n), DIRECT_MIN_BYTES / 4 - 1), vec![(true, 0); n], "{n} ranks, small");
        }
    }

    #[test]
    fn across_hosts_shared_buffers_are_ordinary_memory() {
        let job = LocalJob::new(4).hosts(&[2, 2]);
        assert_eq!(on(4, job, DIRECT_MIN_BYTES), vec![(true, 0); 4]);
        let forced = crate::Config { algo: Some(crate::algo::Algo::Ring), ..crate::Config::default() };
        assert_eq!(on(2, LocalJob::new(2).config(forced), DIRECT_MIN_BYTES), vec![(true, 0); 2]);
    }

    #[test]
    fn buffers_of_different_allocations_fail_on_every_rank() {
        let count = DIRECT_MIN_BYTES;
        let errs = run_local(3, |g| {
            let c = g.typed::<f32>();
            let mut a = c.alloc_shared(count).expect("alloc");
            let mut b = c.alloc_shared(count).expect("alloc");
            let mine = if g.rank() == 1 { &mut b } else { &mut a };
            c.all_reduce(mine, Sum).expect_err("mismatched").to_string()
        });
        for (r, e) in errs.iter().enumerate() {
            assert!(
                e.contains(&format!("rank {r}")) && e.contains("all_reduce #") && e.contains("same allocation"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_rank_passing_ordinary_memory_fails_instead_of_hanging() {
        let count = DIRECT_MIN_BYTES;
        let errs = run_local(2, |g| {
            let c = g.typed::<f32>().with_timeout(std::time::Duration::from_secs(20));
            let mut a = c.alloc_shared(count).expect("alloc");
            let r = if g.rank() == 0 { c.all_reduce(&mut a, Sum) } else { c.all_reduce(&mut vec![0f32; count], Sum) };
            r.expect_err("one shared, one not").to_string()
        });
        for e in errs {
            assert!(e.contains("all_reduce #") && e.contains("8 × shared-buffer frame of 8 B, max"), "{e}");
        }
    }
}
