//! A rank's last collective calls, where the ranks of its host can read
//! them: how ranks that disagree on a call find out while one of them
//! waits for the other, instead of when the deadline runs out.
//!
//! A call whose ranks disagree on its root or count may send nothing that
//! the peers check (each rank of a broadcast that thinks itself the root
//! only sends; each of a reduce only receives). Every rank posts each
//! collective's fingerprint here as it starts it; a rank stuck waiting on
//! a peer compares what the peer posted for the same call numbers with
//! its own, and fails naming both calls. Entries are written by their
//! rank alone, under a sequence lock, and read only on slow paths. Peers
//! on other hosts are told a stuck rank's calls over TCP instead
//! (`transport::tcp::notice`).

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// A call's fingerprint, as slots carry it (its number last).
pub type Words = [u64; 4];

/// Calls kept: the last this many of all of a rank's communicators.
pub const ENTRIES: usize = 16;

/// One posted call: its communicator, its number + 1 (0 while being
/// written or never), and its fingerprint.
#[repr(C)]
struct Entry {
    seq: AtomicU64,
    comm: AtomicU64,
    fp: [AtomicU64; 4],
}

/// The board: plain atomics, valid when zero-filled, so it can live in a
/// shared page.
#[repr(C)]
pub struct CallBoard {
    entries: [Entry; ENTRIES],
}

impl Default for CallBoard {
    fn default() -> Self {
        CallBoard {
            entries: std::array::from_fn(|_| Entry {
                seq: AtomicU64::new(0),
                comm: AtomicU64::new(0),
                fp: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }
}

fn slot(comm: u64, seq: u64) -> usize {
    (seq.wrapping_add(comm.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) % ENTRIES as u64) as usize
}

impl CallBoard {
    /// Posts call `fp` (its number is `fp[3]`) of communicator `comm`.
    /// Only the board's own rank posts.
    pub fn post(&self, comm: u64, fp: &Words) {
        let e = &self.entries[slot(comm, fp[3])];
        e.seq.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        e.comm.store(comm, Ordering::Relaxed);
        for (w, v) in e.fp.iter().zip(fp) {
            w.store(*v, Ordering::Relaxed);
        }
        e.seq.store(fp[3].wrapping_add(1), Ordering::Release);
    }

    /// What call number `seq` of communicator `comm` was, if still here.
    pub fn get(&self, comm: u64, seq: u64) -> Option<Words> {
        let e = &self.entries[slot(comm, seq)];
        let s1 = e.seq.load(Ordering::Acquire);
        if s1 != seq.wrapping_add(1) {
            return None;
        }
        let c = e.comm.load(Ordering::Relaxed);
        let fp: Words = std::array::from_fn(|i| e.fp[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (e.seq.load(Ordering::Relaxed) == s1 && c == comm).then_some(fp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posted_calls_read_back_until_overwritten_and_never_torn() {
        let b = CallBoard::default();
        assert_eq!(b.get(7, 0), None);
        b.post(7, &[1, 2, 3, 0]);
        b.post(8, &[4, 5, 6, 0]);
        assert_eq!(b.get(7, 0), Some([1, 2, 3, 0]));
        assert_eq!(b.get(8, 0), Some([4, 5, 6, 0]));
        assert_eq!(b.get(7, 1), None);
        for s in 1..=ENTRIES as u64 {
            b.post(7, &[9, 9, 9, s]);
        }
        assert_eq!(b.get(7, 0), None, "overwritten by later calls");
        assert_eq!(b.get(7, ENTRIES as u64), Some([9, 9, 9, ENTRIES as u64]));
        // a reader beside a writer sees whole entries or none
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for s in 0..20_000u64 {
                    b.post(1, &[s, s, s, s]);
                }
            });
            for _ in 0..20_000 {
                for s in [0u64, 5, 19_999] {
                    if let Some(w) = b.get(1, s) {
                        assert_eq!(w, [s; 4]);
                    }
                }
            }
        });
    }
}
