//! The progress engine's core: runs one rank's [`Schedule`](crate::algo::Schedule) over
//! connections, slot by slot, advancing every channel that can move.
//!
//! The executor knows no algorithm. It validates a schedule against its
//! buffers once (every region inside its buffer, fused operands identical
//! or disjoint), then moves data with the vectorised kernels straight
//! between user memory and slots: a receive reduces out of the incoming
//! slot, a fused receive-reduce-send writes the result into the outgoing
//! slot, and nothing is copied twice. Connections that copy anyway (sockets,
//! whose kernel copies what they send) take memory that no later step
//! writes straight from the call's buffers, without a slot.

mod conns;
mod lend;
pub mod device;
pub(crate) mod engine;
mod host;
mod on_gpu;
mod wiring;

use crate::plan::{writes_around, DevCall, Peers, Plan};
pub use conns::Conns;
use wiring::Wiring;

use crate::algo::lend::SendMode;
use crate::algo::{Buf, Layout, Region, Step};
use crate::transport::{RecvVerbs, SendVerbs};
use crate::error::{Error, ErrorKind, Result};
use crate::op::ReduceOp;
use crate::plan::fingerprint;
use crate::Reduce;
use smallvec::SmallVec;
use std::marker::PhantomData;
use std::sync::Arc;

/// One call in progress on this rank.
pub struct Exec<T: Reduce, O: ReduceOp<T>> {
    layout: Layout,
    input: *const T,
    output: *mut T,
    scratch: Vec<T>,
    /// Per channel: the step it is at and the slot within that step.
    pcs: SmallVec<[(usize, usize); 4]>,
    /// Per channel: the peer it last found itself waiting on, and at which
    /// (step, slot): for a message from it, or a free slot towards it.
    stalled: SmallVec<[Stall; 4]>,
    wiring: Arc<Wiring>,
    slot_elems: usize,
    fp: fingerprint::Words,
    /// What a varying all-to-all sends each peer and receives from it
    /// ([`Plan::pairs`]).
    pairs: Option<Arc<crate::algo::Blocks>>,
    /// Whether data written into the output goes around the cache (see
    /// [`Plan::around_cache_from`]).
    around_cache: bool,
    /// Whether slots are written around the cache ([`Plan::slots_around`]).
    slots_around: bool,
    /// Whether small messages move around inside their slots ([`Plan::spread`]).
    spread: bool,
    /// Boxed: host calls, the common case, move a smaller `Exec`.
    gpu: Option<Box<OnGpu>>,
    /// Every rank's buffers, for a schedule that reaches them ([`Peers`]),
    /// valid while the call runs as its own buffers are.
    peers: Option<RawPeers>,
    /// Sending connections that may still read this call's buffers (memory
    /// sent from where it is, [`Lending::send`]): the call is not done,
    /// and its buffers stay the caller's, until they have sent it; and the
    /// rank each sends to.
    lent: SmallVec<[(usize, usize); 4]>,
    /// Per channel: the steps so far whose incoming messages have been
    /// given places in the call's memory ([`give_places`](Self::give_places)).
    placed: SmallVec<[usize; 4]>,
    _op: PhantomData<O>,
}

/// Where a channel found itself waiting: at (step, slot), on a peer.
type Stall = Option<((usize, usize), usize)>;

/// [`Peers`] as a call keeps them (an empty input in place).
#[derive(Clone, Copy, Debug)]
struct RawPeers {
    input: *const [usize],
    output: *const [usize],
}

impl RawPeers {
    fn of(p: Option<Peers<'_>>) -> Option<Self> {
        p.map(|p| RawPeers { input: p.input.unwrap_or(&[]), output: p.output })
    }
}

/// A device call's GPU, its device scratch (the communicator's, kept
/// from call to call) and the connections whose per-call message (the
/// fingerprint, see [`device`]) has been sent or checked.
struct OnGpu {
    call: DevCall,
    scratch: u64,
    /// Each channel's stream (the call's own, for one channel), joined
    /// back into the call's once every channel is queued (`joined`).
    streams: SmallVec<[u64; 4]>,
    joined: bool,
    /// Whether the call's stream is being captured into a graph.
    captured: bool,
    /// The flags its streams wait on, the ranks that write them, and the
    /// poison marks of its connections with their peers.
    waits: Vec<u64>,
    peers: SmallVec<[usize; 4]>,
    marks: Vec<(u64, usize)>,
    told: SmallVec<[usize; 4]>,
    heard: SmallVec<[usize; 4]>,
    /// This rank, for messages.
    rank: usize,
    /// A call the proxy finishes ([`conns::Proxy`]): its ticket. Its
    /// channels' streams are taken when its turn comes (`streams` empty
    /// until then).
    ticket: Option<conns::Ticket>,
    /// Per channel: the slot whose copies through a host slot (staged)
    /// are queued, until the stream has run them.
    stage: SmallVec<[Option<on_gpu::Staged>; 4]>,
}

impl OnGpu {
    /// The flags the GPU watch releases, with the value that releases each.
    fn releases(&mut self) -> Vec<(u64, u64)> {
        let done = self.ticket.map(|t| (t.done, t.released()));
        std::mem::take(&mut self.waits).into_iter().map(|f| (f, crate::gpu::watch::RELEASED)).chain(done).collect()
    }
}

impl<T: Reduce, O: ReduceOp<T>> Drop for Exec<T, O> {
    /// A device call that fails on the host after queueing part of its
    /// work leaves waits on its streams that may never be met: the GPU
    /// watch releases them at once.
    fn drop(&mut self) {
        let left = |g: &&mut Box<OnGpu>| !g.joined && !g.captured && (!g.waits.is_empty() || g.ticket.is_some());
        let Some(g) = self.gpu.as_mut().filter(left) else { return };
        // the call's stream then ends after every channel's, as the watch expects
        let raw = g.call.stream.raw();
        for &s in g.streams.iter().filter(|&&s| s != raw) {
            let _ = g.call.dev.join(raw, s);
        }
        crate::gpu::watch::watch(crate::gpu::watch::InFlight {
            stream: g.call.stream.clone(),
            flags: g.releases(),
            marks: std::mem::take(&mut g.marks),
            alive: Box::new(|| Ok(())),
            deadline: std::time::Instant::now(),
            what: format!("{} at rank {}", fingerprint::Fingerprint::describe(&self.fp), g.rank),
            abandoned: Some("the call failed on the host after queueing part of its device work"),
            released: false,
        });
    }
}

// SAFETY: the raw pointers refer to buffers the caller guarantees stay
// valid and unaliased while the call runs (a borrow held across the
// blocking call, or a Vec owned by the same pending operation); nothing in
// `Exec` is tied to the thread that created it.
unsafe impl<T: Reduce, O: ReduceOp<T>> Send for Exec<T, O> {}

impl<T: Reduce, O: ReduceOp<T>> Exec<T, O> {
    /// Prepares `plan` over the given buffers, connecting every link it uses.
    ///
    /// # Safety
    ///
    /// `input` must be valid for reads of `layout.capacity(Input)` elements
    /// and `output` for reads and writes of `layout.capacity(Output)`
    /// elements (in place: `input` is ignored and `output` covers the
    /// shared buffer), for as long as this `Exec` is advanced, and nothing
    /// else may access the output memory meanwhile. The same holds for
    /// every rank's buffers at `plan.peers`, each as long as this rank's,
    /// but for what the other ranks' schedules touch (which the verifier
    /// proves disjoint from what this one touches, and ordered by messages).
    pub unsafe fn new(plan: Plan<'_>, input: *const T, output: *mut T, conns: &mut Conns) -> Result<Self> {
        let Plan { checked, slot_elems, channel_base, fp, pairs, device, around_cache_from, slots_around, spread, peers } =
            plan;
        let layout = checked.layout;
        if !checked.fits(peers) || peers.is_some() && device.is_some() {
            return Err(Error::internal("a schedule over peers' buffers without them all, or on a GPU"));
        }
        let size = std::mem::size_of::<T>();
        if size == 0 || std::mem::align_of::<T>() > crate::transport::fifo::SLOT_ALIGN {
            return Err(Error::new(ErrorKind::Unsupported(format!(
                "element type {} (size {size}, alignment {})",
                T::NAME,
                std::mem::align_of::<T>()
            ))));
        }
        let wiring = checked.wired(|| Wiring::new(&checked.sched, checked.lending.clone(), channel_base, conns))?;
        let sched = &wiring.sched;
        let room = device.as_ref().map_or(0, |d| d.slots.slot_bytes).max(conns.slot_bytes());
        if slot_elems == 0 || slot_elems * size > room {
            return Err(Error::internal(format!("{slot_elems} elements of {size} B do not fit a slot")));
        }
        let (scratch, gpu) = match device {
            None => (vec![T::zeroed(); sched.scratch], None),
            Some(call) => {
                let captured = call.dev.capturing(call.stream.raw())?;
                let proxied = conns.proxy.on || call.proxy || conns.any_pollable_of(&wiring.uses);
                if captured && proxied {
                    return Err(Error::device(
                        "a device call over a connection staged through the host (tcp) cannot be captured into a \
                         graph: its bytes need the host at every run (capture calls among ranks of one host, or \
                         make this one eagerly); nor can any device call on a communicator whose device calls go \
                         through its proxy thread (after one over tcp, or with CCL_GPU_PROXY=1)",
                    ));
                }
                let bytes = sched.scratch * size;
                let (scratch, streams, ticket) = if proxied {
                    let (scratch, t) = conns.dev_proxied(&call, bytes)?;
                    (scratch, SmallVec::new(), Some(t))
                } else {
                    let (scratch, streams) = conns.dev_prepare(&call, bytes, sched.channels.len(), captured)?;
                    (scratch, streams, None)
                };
                let (told, heard, joined, peers) = (SmallVec::new(), SmallVec::new(), false, SmallVec::new());
                let (waits, marks, rank) = (Vec::new(), Vec::new(), conns.me());
                let stage = smallvec::smallvec![None; sched.channels.len()];
                let g = OnGpu {
                    call: *call,
                    scratch,
                    streams,
                    joined,
                    captured,
                    waits,
                    peers,
                    marks,
                    told,
                    heard,
                    rank,
                    ticket,
                    stage,
                };
                (Vec::new(), Some(Box::new(g)))
            }
        };
        let pcs = smallvec::smallvec![(0, 0); sched.channels.len()];
        let stalled = smallvec::smallvec![None; sched.channels.len()];
        let placed = smallvec::smallvec![0; sched.channels.len()];
        let input = Self::input_of(&layout, input, output);
        let fp = fp.words();
        let around_cache = gpu.is_none() && Self::output_around_cache(&layout, around_cache_from);
        Ok(Exec {
            layout,
            input,
            output,
            scratch,
            pcs,
            stalled,
            wiring,
            slot_elems,
            fp,
            pairs,
            around_cache,
            slots_around,
            spread,
            gpu,
            peers: RawPeers::of(peers),
            lent: SmallVec::new(),
            placed,
            _op: PhantomData,
        })
    }

    /// Where a call of `layout` reads its input: the output, in place.
    fn input_of(layout: &Layout, input: *const T, output: *mut T) -> *const T {
        if layout.in_place.is_some() {
            output as *const T
        } else {
            input
        }
    }

    /// Whether a host call's output of `layout` is large enough to be
    /// written around the cache ([`Plan::around_cache_from`]), and not the
    /// call's input too: in place, every line written was read earlier in
    /// the call, so an ordinary store finds it in the cache more often than
    /// not, where a streaming one must first push it out
    /// (`bench/results/nt-stores.md`).
    fn output_around_cache(layout: &Layout, from: usize) -> bool {
        writes_around(layout, std::mem::size_of::<T>(), from)
    }

    /// Makes this call, once it has finished or before it starts, the next
    /// call of the same plan on other buffers, as [`new`](Self::new) would
    /// make it, keeping its connections and scratch (a repeated small call
    /// then costs no allocation or setup). `false`, and nothing changed,
    /// when `plan` is not the plan this call runs (another schedule or slot
    /// size) or either is a device call.
    ///
    /// # Safety
    ///
    /// As [`new`](Self::new), for the new buffers.
    pub unsafe fn reuse(&mut self, plan: &Plan<'_>, input: *const T, output: *mut T) -> bool {
        let same_wiring = plan.checked.wired_as(&self.wiring);
        let fits = plan.checked.fits(plan.peers);
        if !same_wiring || !fits || plan.slot_elems != self.slot_elems || plan.device.is_some() || self.gpu.is_some() {
            return false;
        }
        self.peers = RawPeers::of(plan.peers);
        self.input = Self::input_of(&self.layout, input, output);
        self.output = output;
        self.fp = plan.fp.words();
        self.pairs.clone_from(&plan.pairs);
        self.around_cache = Self::output_around_cache(&self.layout, plan.around_cache_from);
        self.slots_around = plan.slots_around;
        self.spread = plan.spread;
        self.pcs.iter_mut().for_each(|pc| *pc = (0, 0));
        self.stalled.iter_mut().for_each(|s| *s = None);
        self.lent.clear();
        self.placed.iter_mut().for_each(|p| *p = 0);
        true
    }

    /// The stream of a device call that the communicator's proxy thread
    /// must finish after it returns; `None` for the others.
    pub fn proxied(&self) -> Option<&crate::gpu::Stream> {
        self.gpu.as_ref().filter(|g| g.ticket.is_some()).map(|g| &g.call.stream)
    }

    /// Whether every channel has finished and every byte sent from the
    /// call's buffers has left them.
    pub fn done(&self) -> bool {
        self.lent.is_empty() && self.channels_done()
    }

    fn channels_done(&self) -> bool {
        self.pcs.iter().zip(&self.wiring.sched.channels).all(|(&(i, _), ch)| i >= ch.len())
    }

    /// Advances every channel as far as it can go now; `true` if anything
    /// moved. A device call queues each channel on a stream of its own
    /// (channels queued on one stream in different orders on two ranks
    /// could wait on each other), joined back into the call's stream once
    /// all are queued.
    pub fn advance(&mut self, conns: &mut Conns) -> Result<bool> {
        if !self.gpu_started(conns)? {
            return Ok(false);
        }
        let mut moved = false;
        for c in 0..self.pcs.len() {
            while self.step(c, conns)? {
                moved = true;
            }
        }
        if self.gpu.as_ref().is_some_and(|g| !g.joined) && self.channels_done() {
            self.gpu_join(conns)?;
        }
        self.forget_sent(conns);
        Ok(moved)
    }

    /// Forgets connections that have handed all lent memory to the kernel.
    fn forget_sent(&mut self, conns: &mut Conns) {
        if !self.lent.is_empty() {
            self.lent.retain(|(si, _)| conns.send_at(*si).lent() > 0);
        }
    }

    /// Applies the operator's finishing pass (Avg's division) to the output
    /// (a device call queues it with its last work: [`DevCall::finish`]).
    pub fn finish(&mut self, nranks: usize) -> Result<()> {
        let out = self.layout.resolve(Region::new(Buf::Output, 0, self.layout.output));
        if self.gpu.is_some() {
            return Ok(());
        }
        // SAFETY: validated region of the output buffer; no slot or other
        // slice is alive.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr(out), out.len) };
        O::finish(dst, nranks);
        Ok(())
    }

    /// The ranks the unfinished channels are waiting on, and those that
    /// memory lent from the call's buffers still goes to. A channel that
    /// found itself waiting at its step names the one peer it waits on
    /// there (a peer whose message has arrived is waited on no longer,
    /// even where it has exited since); else both of its step's peers.
    pub fn blocked_on(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .pcs
            .iter()
            .enumerate()
            .filter_map(|(c, &pc)| Some((c, pc, self.wiring.sched.channels[c].get(pc.0)?)))
            .flat_map(|(c, pc, st)| match self.stalled[c] {
                Some((at, peer)) if at == pc => [Some(peer), None],
                _ => [st.recv_peer(), st.send_peer()],
            })
            .flatten()
            .chain(self.lent.iter().map(|&(_, peer)| peer))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// What the unfinished channels wait for, for timeout messages.
    pub fn waiting(&self) -> String {
        let mut w = Vec::new();
        for (c, &(i, _)) in self.pcs.iter().enumerate() {
            if let Some(st) = self.wiring.sched.channels[c].get(i) {
                let what = match (st.recv_peer(), st.send_peer()) {
                    (Some(f), _) => format!("to receive from rank {f}"),
                    (None, Some(t)) => format!("for a free slot towards rank {t}"),
                    _ => "on a local step".into(),
                };
                w.push(format!("channel {c} step {i} waiting {what}"));
            }
        }
        if !self.lent.is_empty() {
            let to: Vec<String> = self.lent.iter().map(|(_, peer)| format!("rank {peer}")).collect();
            w.push(format!("still sending from the call's buffers to {}", to.join(", ")));
        }
        w.join("; ")
    }

    /// The connections this call uses (by [`Conns::send_id`] and
    /// [`Conns::recv_id`]), sorted, once each.
    pub fn uses(&self) -> &[usize] {
        &self.wiring.uses
    }

    fn ptr(&self, r: Region) -> *mut T {
        let base = match r.buf {
            Buf::Input => self.input as *mut T,
            Buf::Output => self.output,
            Buf::Scratch => self.scratch.as_ptr() as *mut T,
            Buf::PeerInput(q) | Buf::PeerOutput(q) => match self.peers {
                Some(p) => {
                    let of = if matches!(r.buf, Buf::PeerInput(_)) { p.input } else { p.output };
                    // SAFETY: the addresses the call was given (`new`,
                    // `reuse`), which live while it runs as its buffers
                    // do; every peer region's rank has one (`Checked::fits`).
                    (unsafe { &*of })[q as usize] as *mut T
                }
                None => std::ptr::null_mut(),
            },
        };
        // SAFETY: `r` is a resolved, validated region, so `r.off` is within
        // (or one past) the buffer `base` points to (a peer's of the same
        // allocation, as long as this rank's: `alloc_shared` checked).
        unsafe { base.add(r.off) }
    }

    /// The device address of a resolved region (device calls).
    fn dptr(&self, r: Region) -> u64 {
        let base = match r.buf {
            Buf::Input => self.input as u64,
            Buf::Output => self.output as u64,
            Buf::Scratch => self.gpu.as_ref().map_or(0, |g| g.scratch),
            // (refused in `new`)
            Buf::PeerInput(_) | Buf::PeerOutput(_) => 0,
        };
        base + (r.off * std::mem::size_of::<T>()) as u64
    }

    /// `Ok` when a message (its bytes and fingerprint) is the one this
    /// call expects from `peer`: `expected` bytes of this call.
    fn check_message(&self, peer: usize, (bytes, fp): (usize, [u64; 4]), expected: usize, conns: &mut Conns) -> Result<()> {
        let want = self.fp_with(peer, false);
        if fp != want {
            let (ours, theirs) = conns.explain(peer, &want, &fp);
            conns.post_disagreement(&theirs);
            return Err(Error::new(fingerprint::Fingerprint::mismatch(&ours, &theirs)).with_peer(peer));
        }
        if bytes != expected {
            return Err(Error::new(ErrorKind::MessageSize { expected, got: bytes }).with_peer(peer));
        }
        Ok(())
    }

    /// The fingerprint words of a message to (`to`) or from `peer`: the
    /// call's, with a varying all-to-all's count for that pair.
    #[inline]
    fn fp_with(&self, peer: usize, to: bool) -> fingerprint::Words {
        match &self.pairs {
            None => self.fp,
            Some(b) => {
                let of = if to { &b.all } else { &b.recv };
                fingerprint::Fingerprint::pair(self.fp, of.get(peer).map_or(0, |r| r.len()))
            }
        }
    }

    /// Moves channel `c` by one slot (or one local step).
    #[inline]
    fn step(&mut self, c: usize, conns: &mut Conns) -> Result<bool> {
        let (i, u) = self.pcs[c];
        let Some(&st) = self.wiring.sched.channels[c].get(i) else {
            return Ok(false);
        };
        let (si, ri) = self.wiring.links[c][i];
        if self.gpu.is_some() {
            return self.gpu_slot(c, st, (si, ri), conns);
        }
        let size = std::mem::size_of::<T>();
        let se = self.slot_elems;
        let len = st.len();
        let off = u * se;
        let n = len.saturating_sub(off).min(se);
        // the slice of region `g` this slot covers
        let at = |g: Region| self.layout.resolve(Region::new(g.buf, g.off + off, n));

        if let Some(ri) = ri {
            if self.wiring.lending.lands[c][i] && self.placed[c] <= i {
                self.placed[c] = i + 1;
                self.give_places(c, i, ri, conns);
            }
        }
        // claim the incoming and outgoing slots before touching anything
        let incoming = match ri {
            Some(ri) => match conns.recv_at(ri).peek().map_err(|e| e.with_peer(st.recv_peer().unwrap_or(0)))? {
                Some((p, bytes, fp)) => {
                    self.check_message(st.recv_peer().unwrap_or(0), (bytes, fp), n * size, conns)?;
                    Some(p as *const T)
                }
                None => {
                    self.stalled[c] = st.recv_peer().map(|p| ((i, u), p));
                    return Ok(false);
                }
            },
            None => None,
        };
        let outgoing = match si {
            Some(si) => match conns
                .send_at(si)
                .reserve(n * size, self.spread)
                .map_err(|e| e.with_peer(st.send_peer().unwrap_or(0)))?
            {
                Some(p) => Some(p as *mut T),
                None => {
                    self.stalled[c] = st.send_peer().map(|p| ((i, u), p));
                    return Ok(false);
                }
            },
            None => None,
        };
        let lend;
        // local steps taken (0: a slot of a step with messages)
        let local = {
            let mode = self.wiring.lending.send[c][i];
            let lends = mode != SendMode::Slot && si.is_some_and(|si| conns.send_lends(si));
            if self.wiring.lending.takes_back[c][i] && !self.lent.is_empty() {
                // memory this slot (a local step: its whole region)
                // overwrites may still be lent, holding a slot: take it back
                let w = match st {
                    Step::Copy { dst, .. } | Step::Reduce { dst, .. } => Some(self.layout.resolve(dst)),
                    _ => st.writes().map(at),
                };
                if let Some(w) = w {
                    self.take_back(w, conns);
                }
            }
            let next = st.is_local().then(|| self.wiring.sched.channels[c].get(i + 1).copied()).flatten();
            let (steps, lent) = self.host_step((st, next), at, incoming, outgoing, n, lends);
            lend = lent;
            steps
        };
        match (si, lend) {
            (Some(si), Some(r)) => {
                let (p, bytes) = (self.ptr(r) as *const u8, n * size);
                let peer = st.send_peer().unwrap_or(0);
                let hold = self.wiring.lending.send[c][i] == SendMode::Hold;
                let fp = self.fp_with(peer, true);
                // SAFETY: a validated region of this call's buffers that no
                // step writes from now on, or (`hold`) that every step
                // writing it takes back first (`Lending`, proved by the
                // verifier); the call is not done, so its buffers stay the
                // caller's, until the connection has sent it (`done`), and
                // a failing call has it forgotten
                // (`Conns::forget_call_memory`) before they go back.
                unsafe { conns.send_at(si).lend(p, bytes, &fp, hold) }.map_err(|e| e.with_peer(peer))?;
                if !self.lent.iter().any(|&(s, _)| s == si) {
                    self.lent.push((si, peer));
                }
            }
            (Some(si), None) => conns.send_at(si).post(n * size, &self.fp_with(st.send_peer().unwrap_or(0), true)),
            (None, _) => {}
        }
        if let Some(ri) = ri {
            conns.recv_at(ri).release();
        }
        let slots = len.div_ceil(se).max(1);
        self.pcs[c] = if local > 0 { (i + local, 0) } else if u + 1 >= slots { (i + 1, 0) } else { (i, u + 1) };
        Ok(true)
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Checked;
    use crate::algo::{generate, Algo, Coll, Params};
    use crate::topo::Hosts;

    #[test]
    fn large_outputs_go_around_the_cache_only_out_of_place() {
        type E = Exec<f32, crate::Sum>;
        // 1 MiB of f32 per rank's block, 4 ranks: streamed from `from` bytes of output
        let around = |coll: Coll, in_place: bool, from: usize| {
            E::output_around_cache(&coll.layout(4, 1, 1 << 18, 0, in_place), from)
        };
        for coll in [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast] {
            assert!(!around(coll, false, 0), "{coll}: 0 is never");
            assert!(around(coll, false, 1 << 20), "{coll}: 1 MiB of output");
            assert!(!around(coll, true, 1), "{coll} in place");
        }
        assert!(around(Coll::AllGather, false, 4 << 20), "4 × 1 MiB gathered");
        assert!(!around(Coll::AllReduce, false, 4 << 20), "1 MiB reduced");
    }

    #[test]
    fn a_call_still_sending_from_its_buffers_waits_on_that_peer() {
        use crate::transport::{tcp::Tcp, Geometry, Registry, Transport};
        // rank 0 broadcasts more than the sockets hold to rank 1, which never reads
        let tcp = |me: usize, peers: Vec<std::net::SocketAddr>| {
            let l = Tcp::listen([127, 0, 0, 1].into()).expect("listen");
            let addr = l.local_addr().expect("addr");
            (Tcp::new(me, [3; 16], l, peers, 1, false), addr)
        };
        let (rx, rx_addr) = tcp(1, Vec::new());
        let (tx, _) = tcp(0, vec![rx_addr; 2]);
        let ring = Geometry { nslots: 4, slot_bytes: 1 << 20 };
        let _r = rx.connect_recv(crate::transport::ConnKey { comm: 5, from: 0, to: 1, channel: 0 }, ring);
        let reg = Arc::new(Registry::new(vec![Arc::new(tx) as Arc<dyn Transport>]).expect("registry"));
        let mut conns = Conns::new(reg, 5, 0, Arc::from([0usize, 1]), ring);
        let count = 16 << 20;
        let hosts = Hosts::flat(2);
        let p =
            Params { nranks: 2, rank: 0, count, root: 0, channels: 1, chunk: 1 << 18, in_place: false, around: false, hosts: &hosts, blocks: None };
        let s = generate(Coll::Broadcast, Algo::Ring, &p).expect("schedule");
        let checked = Checked::new(s, Coll::Broadcast.layout(2, 0, count, 0, false)).expect("checked");
        let fp = fingerprint::Fingerprint::new(Coll::Broadcast, 4, 1, 0, count, 0, 0);
        let plan = Plan {
            checked: &checked,
            slot_elems: 1 << 18,
            channel_base: 0,
            fp,
            pairs: None,
            device: None,
            around_cache_from: 0,
            slots_around: false,
            spread: false,
            peers: None,
        };
        let (input, mut output) = (vec![1.0f32; count], vec![0.0f32; count]);
        // SAFETY: both buffers outlive the call, which is dropped (its lent
        // memory forgotten) before them.
        let mut ex = unsafe { Exec::<f32, crate::Sum>::new(plan, input.as_ptr(), output.as_mut_ptr(), &mut conns) }
            .expect("exec");
        let t = std::time::Instant::now();
        while !ex.channels_done() && t.elapsed() < std::time::Duration::from_secs(10) {
            ex.advance(&mut conns).expect("advance");
        }
        assert!(ex.channels_done() && !ex.done(), "every step taken, 64 MiB not yet sent");
        assert_eq!(ex.blocked_on(), vec![1], "{}", ex.waiting());
        assert!(ex.waiting().contains("still sending from the call's buffers to rank 1"), "{}", ex.waiting());
        conns.forget_call_memory();
    }
}
