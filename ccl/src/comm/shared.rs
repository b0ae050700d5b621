//! Shared buffers: memory every rank of a host maps, so that collectives on
//! it read their peers' inputs and write their outputs directly, with no
//! slots in between (NCCL's `ncclMemAlloc` and buffer registration, in one
//! collective call: [`Communicator::alloc_shared`](super::Communicator::alloc_shared)).
//!
//! In an all-reduce each rank reduces its share of the elements from every
//! rank's input and writes the result into every rank's output: it reads
//! and writes each of its share's bytes once per rank, as one memcpy of the
//! buffer would. A reduce-scatter reduces the rank's own block, an
//! all-gather writes it into every output, a broadcast copies the rank's
//! share of the root's buffer. Two small all-reduces of the call's
//! description frame the work: the first checks that every rank passed the
//! same allocation, count, root, type and operator, and lets no rank read a
//! buffer before its owner has entered the call; the second lets no rank
//! return before every output is written. Both go through the connections
//! like any call, so deadlines, lost peers and mismatched calls fail as they
//! do there.

use super::group::{Group, Inner};
use crate::algo::Coll;
use crate::config::LogLevel;
use crate::error::{Error, Result};
use crate::exec::store;
use crate::op::ReduceOp;
use crate::plan::fingerprint::NameHashes as Names;
use crate::transport::shm_file::JobFiles;
use crate::{Max, Min, Reduce};
use memmap2::{MmapOptions, MmapRaw};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Files created by this process so far: numbers their names.
static CREATED: AtomicU64 = AtomicU64::new(0);

/// Elements a rank reduces and then copies out to its peers at a time:
/// small enough that the copies read the result from the L1/L2 cache.
const BLOCK_BYTES: usize = 32 << 10;

/// Calls smaller than this run through the connections instead: below it
/// the two framing all-reduces cost what the slots save
/// (`bench/results/shared-buffers.md`).
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

/// Process `pid`'s file for its buffer `number`: named, made and opened
/// as the transport's files are ([`JobFiles`]), so cclrun removes it with
/// the job's and a sweep once its owner has exited (`-p<pid>`).
fn path(files: &JobFiles, pid: u64, number: u64) -> PathBuf {
    files.path(&format!("a{number}"), &[u32::try_from(pid).unwrap_or(u32::MAX)])
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
    let files = inner.registry.files();
    let file = path(files, pid, created);
    // every rank's file must be on one host, and shared memory allowed
    let local = inner.hosts.groups().len() == 1 && !inner.config.shm_disable;
    // its bytes reserved now: a /dev/shm too small fails here, not with
    // SIGBUS when a page is first touched
    let shared = || -> Result<MmapRaw> {
        let f = files.create(&file, bytes.max(1) as u64)?;
        map(&f, true).map_err(|e| Error::transport(format!("mmap {}: {e}", file.display())))
    };
    let (own, made) = match local.then(shared) {
        Some(Ok(m)) => (m, true),
        other => {
            let _ = std::fs::remove_file(&file);
            if let (Some(Err(e)), true) = (other, inner.config.debug >= LogLevel::Warn) {
                // the others are waiting for this rank's part: go on without it
                eprintln!(
                    "ccl: rank {}: alloc_shared #{number}: {e}; the buffer is private memory and collectives on it \
                     go through the connections",
                    inner.rank,
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
            match files.open(&path(files, c[0], c[1]), c[2].max(1)) {
                Ok(Some(f)) => match map(&f, false) {
                    Ok(m) => peers.push(m),
                    Err(_) => break,
                },
                _ => break,
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
    const NAME: &'static str = crate::plan::fingerprint::SHARED_FRAME;
}

impl ReduceOp<Frame> for Max {
    fn combine(a: Frame, b: Frame) -> Frame {
        a.max(b)
    }
}

/// A call to run directly on shared buffers: counts as in
/// [`Call`](crate::plan::Call) (a rank's block for the gather and the
/// scatter); in place, `input` is `None` and the data is in `output`.
pub(crate) struct Direct<'w> {
    pub coll: Coll,
    pub root: usize,
    pub count: usize,
    pub input: Option<&'w Window>,
    pub output: &'w Window,
}

impl Direct<'_> {
    /// Elements of each rank's input and output buffer the call touches.
    fn lens(&self, n: usize) -> (usize, usize) {
        let (c, all) = (self.count, self.count.saturating_mul(n));
        let ip = self.input.is_none();
        match self.coll {
            Coll::AllGather => (c, all),
            Coll::ReduceScatter => (all, if ip { all } else { c }),
            _ => (c, c),
        }
    }

    /// Bytes of the larger of a rank's buffers the call touches.
    pub fn bytes(&self, n: usize, elem: usize) -> usize {
        let (i, o) = self.lens(n);
        i.max(o).saturating_mul(elem)
    }

    /// Every rank's description of the call, spread so that one all-reduce
    /// (max) shows whether all ranks agree: each value next to its complement.
    fn framing<T: Reduce, O: ReduceOp<T>>(&self) -> [Frame; 12] {
        let kinds = (u64::from(Names::<T, O>::TYPE) << 32) | u64::from(Names::<T, O>::OP);
        let coll = u64::from(crate::plan::fingerprint::name_hash(self.coll.name()));
        let input = self.input.map_or(u64::MAX, |w| w.number);
        let words = [coll, self.root as u64, input, self.output.number, self.count as u64, kinds];
        let mut v = [Frame(0); 12];
        for (i, w) in words.iter().enumerate() {
            v[2 * i] = Frame(*w);
            v[2 * i + 1] = Frame(!w);
        }
        v
    }
}

/// The framing all-reduce: numbered `seq`, like the call it frames.
fn frame(group: &Group, seq: u64, timeout: Option<std::time::Duration>, mut v: [Frame; 12]) -> Result<()> {
    let want = v;
    let call = crate::plan::Call {
        coll: Coll::AllReduce,
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
            "the ranks passed shared buffers of different alloc_shared calls, or different counts, roots, types \
             or operators: every rank must pass its buffer of the same allocation",
        ));
    }
    Ok(())
}

/// The ranks' buffers of one window, as mapped here.
struct Bufs<'w, T> {
    w: &'w Window,
    _t: PhantomData<T>,
}

impl<T: Reduce> Bufs<'_, T> {
    /// Rank `r`'s elements `at..at + len`.
    ///
    /// # Safety
    ///
    /// The range must lie in the call's part of the buffer (checked against
    /// the window's size by [`run`]), be one this rank alone touches during
    /// the call, and not overlap another slice alive at the same time.
    #[allow(clippy::mut_from_ref)]
    unsafe fn at(&self, r: usize, at: usize, len: usize) -> &mut [T] {
        // SAFETY: forwarded: every rank's buffer is mapped here for the
        // window's life and holds the range; the framing calls order its
        // owner's own accesses before and after the call.
        unsafe { std::slice::from_raw_parts_mut((self.w.of(r) as *mut T).add(at), len) }
    }
}

/// Reduces elements `from..from + len` of every rank's `src` and writes the
/// result at `to..` of the output of every rank in `dests` (always this
/// rank's own, `me`, first). In place (`src` is the output window), this
/// rank's own input range is its own output range. With `scratch` (large
/// outputs), each block is reduced there and streamed around the cache to
/// every destination, this rank's own included.
fn reduce_out<T: Reduce, O: ReduceOp<T>>(
    (src, out): (&Bufs<'_, T>, &Bufs<'_, T>),
    in_place: bool,
    (from, to, len): (usize, usize, usize),
    (n, me): (usize, usize),
    dests: impl Iterator<Item = usize> + Clone,
    scratch: &mut Option<Box<Block>>,
) {
    let block = (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).max(1);
    let mut at = 0;
    while at < len {
        let l = block.min(len - at);
        // Every range below lies in this rank's share of the call, which no
        // other rank touches; `tmp` is either scratch or this rank's output
        // range, which no input slice overlaps (in place, this rank's own
        // input range is that output range and is never read as an input).
        let tmp: &mut [T] = match scratch.as_mut() {
            // SAFETY: BLOCK_BYTES initialised bytes, 64-byte aligned (as `T`
            // is, checked by `run`), hold `l` ≤ BLOCK_BYTES / size elements;
            // any bit pattern is a valid `T: Reduce`.
            Some(b) => unsafe { std::slice::from_raw_parts_mut(b.0.as_mut_ptr() as *mut T, l) },
            // SAFETY: this rank's output range of its share (see above).
            None => unsafe { out.at(me, to + at, l) },
        };
        // SAFETY: input ranges of this rank's share, only read, none of them `tmp`.
        let read = |r: usize| -> &[T] { unsafe { src.at(r, from + at, l) } };
        let mut others = (0..n).filter(|&r| r != me);
        if in_place && scratch.is_none() {
            // this rank's own contribution is already in `tmp`
        } else if let Some(first) = others.next() {
            O::reduce3(tmp, read(me), read(first));
        } else {
            tmp.copy_from_slice(read(me));
        }
        for r in others {
            O::reduce_into(tmp, read(r));
        }
        O::finish(tmp, n);
        for r in dests.clone().filter(|&r| scratch.is_some() || r != me) {
            // SAFETY: rank r's output range of this rank's share, not `tmp`
            // (this rank's own is written only from scratch).
            store(scratch.is_some(), unsafe { out.at(r, to + at, l) }, tmp);
        }
        at += l;
    }
}

/// Scratch a block is reduced in before it is streamed out.
#[repr(C, align(64))]
struct Block([u8; BLOCK_BYTES]);

/// Runs call number `seq` directly on the shared buffers (see [`Direct`]):
/// all_reduce, broadcast (in place), all_gather and reduce_scatter. The
/// windows must be direct for `group`.
pub(crate) fn run<T: Reduce, O: ReduceOp<T>>(
    group: &Group,
    seq: u64,
    timeout: Option<std::time::Duration>,
    d: &Direct<'_>,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let (n, me) = (group.size(), group.rank());
    let (li, lo) = d.lens(n);
    let too_small = |w: &Window, len: usize| len.saturating_mul(elem) > w.bytes;
    if too_small(d.output, lo) || d.input.is_some_and(|w| too_small(w, li)) || d.root >= n {
        return Err(Error::internal("shared buffers smaller than the call, or a root out of range"));
    }
    let v = d.framing::<T, O>();
    frame(group, seq, timeout, v)?;
    let out = Bufs::<T> { w: d.output, _t: PhantomData };
    let src = Bufs::<T> { w: d.input.unwrap_or(d.output), _t: PhantomData };
    let in_place = d.input.is_none();
    // large outputs: written around the cache, from scratch that stays in
    // L1 (in place, the output lines were just read: through the cache)
    let nt = group.config().nt_stores_min();
    let around = !in_place && nt > 0 && lo.saturating_mul(elem) >= nt && std::mem::align_of::<T>() <= 64;
    let count = d.count;
    // the reductions' blocks, when their outputs are streamed
    let mut scratch = around.then(|| Box::new(Block([0; BLOCK_BYTES])));
    let share = crate::algo::part::split(0..count, n).swap_remove(me);
    match d.coll {
        Coll::AllReduce => {
            let range = (share.start, share.start, share.len());
            let dests = std::iter::once(me).chain((0..n).filter(|&r| r != me));
            reduce_out::<T, O>((&src, &out), in_place, range, (n, me), dests, &mut scratch);
        }
        Coll::ReduceScatter => {
            // this rank's block of every input into its own output
            let to = if in_place { me * count } else { 0 };
            let range = (me * count, to, count);
            reduce_out::<T, O>((&src, &out), in_place, range, (n, me), std::iter::once(me), &mut scratch);
        }
        Coll::Broadcast => {
            // in place: this rank's share of the root's buffer into every other's
            // SAFETY: the root's range of this rank's share, only read.
            let from = unsafe { out.at(d.root, share.start, share.len()) };
            for r in (0..n).filter(|&r| r != d.root) {
                // SAFETY: rank r's range of this rank's share.
                store(around, unsafe { out.at(r, share.start, share.len()) }, from);
            }
        }
        Coll::AllGather => {
            // this rank's block into every rank's output
            // SAFETY: this rank's own input, or its own block of its output
            // (in place), which no other rank touches.
            let mine = unsafe {
                if in_place {
                    out.at(me, me * count, count)
                } else {
                    src.at(me, 0, count)
                }
            };
            for r in (0..n).filter(|&r| !in_place || r != me) {
                // SAFETY: block `me` of rank r's output: written by this rank alone.
                store(around, unsafe { out.at(r, me * count, count) }, mine);
            }
        }
        other => return Err(Error::internal(format!("{} does not run on shared buffers directly", other.name()))),
    }
    frame(group, seq, timeout, v)?;
    if d.output.calls.fetch_add(1, Ordering::Relaxed) == 0 && group.config().debug >= LogLevel::Info {
        eprintln!(
            "ccl: rank {me}: {} #{seq} of {} bytes and later ones on these buffers: directly through shared memory",
            d.coll.name(),
            lo.saturating_mul(elem)
        );
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

    /// Runs every call that can go directly (all-reduce, reduce-scatter and
    /// all-gather in place and not, broadcast in place) with blocks of
    /// `count` on shared buffers on `job` of `n` ranks; per rank: whether
    /// every result was right, and how many calls went directly.
    fn on(n: usize, job: LocalJob, count: usize) -> Vec<(bool, u64)> {
        let ins: Vec<Vec<f32>> = (0..n).map(|_| draw(n * count)).collect();
        let sum = |i: usize| ins.iter().map(|v| v[i]).sum::<f32>();
        let reduced: Vec<f32> = (0..n * count).map(sum).collect();
        let gathered: Vec<f32> = ins.iter().flat_map(|v| v[..count].to_vec()).collect();
        job.run(|g| {
            let (c, r) = (g.typed::<f32>(), g.rank());
            let mine = r * count..(r + 1) * count;
            let alloc = |len| c.alloc_shared(len).expect("alloc");
            let (mut a, mut b, mut x, mut y) = (alloc(n * count), alloc(n * count), alloc(count), alloc(count));
            let mut right = Vec::new();
            x.copy_from_slice(&ins[r][..count]);
            c.all_reduce_into(&x, &mut y, Sum).expect("all_reduce_into");
            right.push(*y == reduced[..count]);
            c.all_reduce(&mut x, Sum).expect("all_reduce");
            right.push(*x == reduced[..count]);
            a.copy_from_slice(&ins[r]);
            c.reduce_scatter(&a, &mut y, Sum).expect("reduce_scatter");
            right.push(*y == reduced[mine.clone()] && *a == ins[r][..]);
            c.reduce_scatter_in_place(&mut a, Sum).expect("reduce_scatter_in_place");
            right.push(a[mine.clone()] == reduced[mine.clone()]);
            x.copy_from_slice(&ins[r][..count]);
            c.all_gather(&x, &mut b).expect("all_gather");
            right.push(*b == gathered[..]);
            a.fill(0.0);
            a[mine.clone()].copy_from_slice(&ins[r][..count]);
            c.all_gather_in_place(&mut a).expect("all_gather_in_place");
            right.push(*a == gathered[..]);
            c.broadcast(&mut x, n - 1).expect("broadcast");
            right.push(*x == ins[n - 1][..count]);
            let calls = [&a, &b, &x, &y].iter().map(|w| w.window().calls.load(Ordering::Relaxed)).sum();
            (right.iter().all(|&ok| ok), calls)
        })
    }

    #[test]
    fn large_calls_on_one_host_go_directly_and_small_ones_through_slots() {
        // (and, out of place, written around the cache as large outputs are)
        let streamed = crate::Config { nt_stores_min: Some(1), ..crate::Config::default() };
        for n in 2..=5 {
            let big = (DIRECT_MIN_BYTES / 4) * 3 + n; // not a multiple of n
            assert_eq!(on(n, LocalJob::new(n), big), vec![(true, 7); n], "{n} ranks");
            assert_eq!(
                on(n, LocalJob::new(n).config(streamed.clone()), big),
                vec![(true, 7); n],
                "{n} ranks, streamed"
            );
            let small = DIRECT_MIN_BYTES / 4 / n - 1;
            assert_eq!(on(n, LocalJob::new(n), small), vec![(true, 0); n], "{n} ranks, small");
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
            assert!(e.contains("all_reduce #") && e.contains("12 × shared-buffer frame of 8 B, max"), "{e}");
        }
    }
}
