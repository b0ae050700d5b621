//! Ranks that disagree on a call: how they find out beyond the
//! fingerprint every message carries.
//!
//! - `CCL_CHECK=full`: before every collective, the ranks all-gather its
//!   fingerprint ([`all_agree`]); any difference fails the call on every
//!   rank, naming this rank's call and a disagreeing rank's; before a
//!   varying all-to-all, each rank also tells every other how much it
//!   sends it ([`all_pairs_agree`]).
//! - By default, a rank stuck waiting compares its last calls with what
//!   the peers it waits on posted, or told it from other hosts
//!   (`Engine::check_peers`); a message left over from an earlier call is
//!   named with this rank's call of that number (`Conns::explain`); and at
//!   the end, [`Group::finalize`] returns, and a communicator dropped
//!   unfinalized says and makes its process exit with [`MISMATCH_EXIT`],
//!   a difference between its last calls and a peer's of its host
//!   ([`end_check`]).

use super::group::{Group, Inner};
use crate::algo::{Blocks, Coll};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::Conns;
use crate::op::{NoOp, ReduceOp};
use crate::plan::fingerprint::{Fingerprint, Words, CHECK_WORD};
use crate::plan::Call;
use crate::Reduce;
use std::time::{Duration, Instant};

/// A word of the exchange: a type of its own, so that a rank checking
/// and one not checking fail naming the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
struct CheckWord(u64);

// SAFETY: a u64: plain data, every bit pattern valid.
unsafe impl Reduce for CheckWord {
    const NAME: &'static str = CHECK_WORD;
}

/// Exchanges `fp`, this rank's next call, with every rank of `group`, as
/// a call of the same number; `Err` naming this rank's call and the first
/// rank's that differs.
pub(crate) fn all_agree(group: &Group, fp: Fingerprint) -> Result<()> {
    let ours = fp.words();
    let mut all = vec![CheckWord(0); 4 * group.size()];
    exchange(group, Coll::AllGather, &ours.map(CheckWord), &mut all, ours[3])?;
    let theirs = all.chunks(4).map(|c| -> Words { std::array::from_fn(|i| c[i].0) });
    match theirs.enumerate().find(|(_, t)| *t != ours) {
        None => Ok(()),
        Some((rank, t)) => {
            let (ours, theirs) = (Fingerprint::describe(&ours), Fingerprint::describe(&t));
            Err(Error::new(ErrorKind::Mismatch { ours, theirs }).with_peer(rank))
        }
    }
}

/// Runs `coll` (all-gather or all-to-all) of check words from `input`
/// into `output` (`size` times as long) as call number `seq`.
fn exchange(group: &Group, coll: Coll, input: &[CheckWord], output: &mut [CheckWord], seq: u64) -> Result<()> {
    let count = if coll == Coll::AllToAll { input.len() / group.size().max(1) } else { input.len() };
    let call = Call {
        coll,
        count,
        root: 0,
        input: input.as_ptr(),
        output: output.as_mut_ptr(),
        in_place: false,
        timeout: None,
        device: None,
        shared: None,
        blocks: None,
    };
    if output.len() != count * group.size() || coll == Coll::AllToAll && input.len() != output.len() {
        return Err(Error::internal("check buffers of the wrong size"));
    }
    // SAFETY: both buffers are the caller's, sized for the call (checked
    // above), and outlive it: run_numbered returns when the call has
    // finished or failed.
    unsafe { group.run_numbered::<CheckWord, NoOp>(call, seq) }
}

/// For a varying all-to-all (`blocks`, this rank's), numbered `seq`:
/// every rank tells each other one how much it sends it, and then every
/// rank the first pair whose sender and receiver disagree, so that all of
/// them fail alike.
fn all_pairs_agree(group: &Group, blocks: &Blocks, seq: u64) -> Result<()> {
    let (n, me) = (group.size(), group.rank());
    let sends: Vec<CheckWord> = blocks.all.iter().map(|b| CheckWord(b.len() as u64)).collect();
    let mut told = vec![CheckWord(0); n];
    exchange(group, Coll::AllToAll, &sends, &mut told, seq)?;
    // (1, sender, sent, expected) for this rank's first disagreeing sender
    let first = told.iter().zip(blocks.recv.iter()).position(|(t, r)| t.0 != r.len() as u64);
    let ours = first.map_or([0; 4], |s| [1, s as u64, told[s].0, blocks.recv[s].len() as u64]);
    let mut all = vec![CheckWord(0); 4 * n];
    exchange(group, Coll::AllGather, &ours.map(CheckWord), &mut all, seq)?;
    let Some((to, w)) = all.chunks(4).enumerate().find(|(_, w)| w[0].0 == 1) else {
        return Ok(());
    };
    let (from, sent, expected) = (w[1].0 as usize, w[2].0, w[3].0);
    let ours = format!("all_to_allv #{seq} in which rank {to} receives {expected} elements from rank {from}");
    let theirs = format!("one in which rank {from} sends it {sent}");
    let peer = if me == to { from } else { to };
    Err(Error::new(ErrorKind::Mismatch { ours, theirs }).with_peer(peer))
}

/// How long a communicator being dropped waits for the peers of its host
/// to post its last call, where they have not yet.
const DROP_WAIT: Duration = Duration::from_millis(100);

/// Where one of the last calls of rank `rank` differs from that of a peer
/// of its host (`local`, this rank among them), the error naming both: the
/// ranks before and after it there, in a ring over the host. Where any
/// ranks of a host disagree, two neighbours do, so some rank finds it, and
/// each rank reads two peers' calls rather than every one's (O(N²)
/// mappings on a host of N ranks). It waits up to [`DROP_WAIT`] for them
/// to post its last call (a rank whose call ended at once may be ahead of
/// its peers).
pub(crate) fn end_check(conns: &Conns, rank: usize, local: &[usize]) -> Option<Error> {
    let n = local.len();
    let at = local.iter().position(|&p| p == rank)?;
    let mut peers: Vec<usize> = [local[(at + 1) % n], local[(at + n - 1) % n]].into();
    peers.dedup();
    peers.retain(|&p| p != rank);
    let t = Instant::now();
    while t.elapsed() < DROP_WAIT && peers.iter().any(|&p| !conns.posted_last(p)) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let (peer, (ours, theirs)) = peers.iter().find_map(|&p| Some((p, conns.disagreement(p)?)))?;
    // each call described names its collective and number
    let (ours, theirs) = (Fingerprint::describe(&ours), Fingerprint::describe(&theirs));
    Some(Error::new(ErrorKind::Mismatch { ours, theirs }).with_peer(peer).at_rank(rank))
}

/// The exit status of a rank process whose communicator, dropped without
/// [`Group::finalize`], found that its calls differed from a peer's.
pub const MISMATCH_EXIT: i32 = 3;

impl Inner {
    /// The end check of [`end_check`] on this group, unless it ran already
    /// (by [`Group::finalize`]) or an earlier error made the communicator
    /// unusable (that error was returned already).
    fn check_at_end(&self) -> Option<Error> {
        if self.size < 2 || self.finalized.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let local = self.hosts.groups().get(self.hosts.host_of(self.rank)).cloned().unwrap_or_default();
        let state = self.state.lock().ok()?;
        state.engine.check_usable().ok()?;
        end_check(&state.engine.conns, self.rank, &local)
    }
}

impl Drop for Inner {
    /// Where this rank's last calls differ from a peer's of its host (a
    /// call whose ranks disagreed on its root or count may have ended on
    /// each of them without an error), says so and makes the process exit
    /// with [`MISMATCH_EXIT`] when it ends (a process of [`crate::init`]).
    fn drop(&mut self) {
        if let Some(e) = self.check_at_end() {
            if self.config.debug >= crate::config::LogLevel::Warn {
                eprintln!("ccl: error: {e} (found as the communicator was dropped)");
            }
            super::exit::fail_at_exit(MISMATCH_EXIT);
        }
    }
}

impl Group {
    /// Ends this rank's use of the group with the check a drop makes,
    /// returned as a value: `Err` (a mismatch naming this rank's call and a
    /// peer's) where one of its last calls differed from that of a peer of
    /// its host, e.g. a broadcast whose ranks named different roots and
    /// each returned. After it, dropping the group checks nothing more.
    /// Under `CCL_CHECK=full` every call was checked already.
    pub fn finalize(self) -> Result<()> {
        self.inner.check_at_end().map_or(Ok(()), Err)
    }

    /// Under `CCL_CHECK=full`, exchanges collective `call`'s fingerprint
    /// with every rank first: `Err` where any differs.
    pub(crate) fn agree<T: Reduce, O: ReduceOp<T>>(&self, call: &Call<'_, T>, seq: u64) -> Result<()> {
        if self.inner.config.check != crate::config::CheckMode::Full || call.coll.p2p() || self.inner.size < 2 {
            return Ok(());
        }
        all_agree(self, call.fingerprint::<O>(seq))?;
        match &call.blocks {
            Some(b) if call.coll == Coll::AllToAll => all_pairs_agree(self, b, seq),
            _ => Ok(()),
        }
    }
}
