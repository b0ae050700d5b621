//! Shared buffers: memory every rank of a host maps, so that collectives on
//! it read their peers' inputs and write their outputs directly, with no
//! slots in between (NCCL's `ncclMemAlloc` and buffer registration, in one
//! collective call: [`Communicator::alloc_shared`](super::Communicator::alloc_shared)).
//! The calls are planned like any other: where every buffer of a call is
//! shared, the tuner may choose the schedules of [`crate::algo::shared`],
//! which reach the peers' buffers through the addresses given here.

use super::group::{Group, Inner};
use crate::config::LogLevel;
use crate::error::{Error, Result};
use crate::plan::{Allocation, OnShared};
use crate::transport::shm_file::JobFiles;
use crate::{Min, Reduce};
use memmap2::{MmapOptions, MmapRaw};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Files created by this process so far: numbers their names.
static CREATED: AtomicU64 = AtomicU64::new(0);

/// The memory of one `alloc_shared` call on one rank: its own buffer and,
/// where every rank of the group can map every other's, all of them.
#[doc(hidden)]
pub struct Window {
    /// The group it was allocated on (only that group's calls use it directly).
    group: Weak<Inner>,
    /// This rank's buffer.
    own: MmapRaw,
    /// Every rank's buffer as mapped here, by rank (this rank's own
    /// included); empty unless every rank mapped every other's.
    peers: Vec<MmapRaw>,
    /// Their addresses, and the allocation's number.
    alloc: Allocation,
}

impl Window {
    /// Every rank's buffers of a call of `group` on this window as output
    /// and `input`'s (none in place) as input, where the call can reach
    /// them: both allocated on `group`, with every rank's buffer mapped.
    pub(crate) fn on<'w>(&'w self, group: &Group, input: Option<&'w Window>) -> Option<OnShared<'w>> {
        let mine = |w: &Window| !w.peers.is_empty() && std::ptr::eq(w.group.as_ptr(), Arc::as_ptr(&group.inner));
        if !mine(self) || !input.is_none_or(mine) {
            return None;
        }
        Some(OnShared { input: input.map(|w| &w.alloc), output: &self.alloc })
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
    let bases = peers.iter().map(|m| m.as_mut_ptr() as usize).collect();
    let alloc = Allocation { bases, number, calls: AtomicU64::new(0) };
    let win = Window { group: Arc::downgrade(inner), own, peers, alloc };
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
            let calls = [&a, &b, &x, &y].iter().map(|w| w.window().alloc.calls.load(Ordering::Relaxed)).sum();
            (right.iter().all(|&ok| ok), calls)
        })
    }

    /// Forces algorithm `algo`.
    fn forced(algo: crate::algo::Algo) -> crate::Config {
        crate::Config { algo: Some(algo), ..crate::Config::default() }
    }

    #[test]
    fn calls_go_directly_where_forced_or_chosen_and_through_slots_where_not() {
        use crate::algo::Algo;
        // (and, out of place, written around the cache as large outputs are)
        let streamed = crate::Config { nt_stores_min: Some(1), ..forced(Algo::Direct) };
        for n in 2..=5 {
            for count in [1, 100, 4096 + n] {
                let job = |c: crate::Config| LocalJob::new(n).config(c);
                assert_eq!(on(n, job(forced(Algo::Direct)), count), vec![(true, 7); n], "{n} ranks, {count}");
                assert_eq!(on(n, job(streamed.clone()), count), vec![(true, 7); n], "{n} ranks, {count}, streamed");
                assert_eq!(on(n, job(forced(Algo::Ring)), count), vec![(true, 0); n], "{n} ranks, {count}, ring");
            }
            // the tuner's choice (which the tuner's tests check), right
            let chosen = on(n, LocalJob::new(n), 1 << 16);
            assert!(chosen.iter().all(|&(right, calls)| right && calls > 0), "{n} ranks: {chosen:?}");
        }
    }

    #[test]
    fn across_hosts_shared_buffers_are_ordinary_memory() {
        let job = LocalJob::new(4).hosts(&[2, 2]).config(forced(crate::algo::Algo::Direct));
        assert_eq!(on(4, job, 4096), vec![(true, 0); 4]);
    }

    #[test]
    fn buffers_of_different_allocations_fail_on_every_rank() {
        // (a call run directly reads and writes the peers' buffers, so they
        // must be one allocation's; through slots any memory does)
        let count = 1 << 16;
        let errs = LocalJob::new(3).config(forced(crate::algo::Algo::Direct)).run(|g| {
            let c = g.typed::<f32>();
            let mut a = c.alloc_shared(count).expect("alloc");
            let mut b = c.alloc_shared(count).expect("alloc");
            let mine = if g.rank() == 1 { &mut b } else { &mut a };
            c.all_reduce(mine, Sum).expect_err("mismatched").to_string()
        });
        for (r, e) in errs.iter().enumerate() {
            assert!(
                e.contains(&format!("rank {r}"))
                    && e.contains("all_reduce #")
                    && e.contains("same alloc_shared allocation"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_rank_passing_ordinary_memory_fails_instead_of_hanging() {
        let count = 1 << 16;
        let errs = run_local(2, |g| {
            let c = g.typed::<f32>().with_timeout(std::time::Duration::from_secs(20));
            let mut a = c.alloc_shared(count).expect("alloc");
            let r = if g.rank() == 0 { c.all_reduce(&mut a, Sum) } else { c.all_reduce(&mut vec![0f32; count], Sum) };
            r.expect_err("one shared, one not").to_string()
        });
        for e in errs {
            assert!(e.contains("all_reduce #") && e.contains("on shared buffers @"), "{e}");
        }
    }
}
