//! Timing every rank's schedule together, in order of when each step can
//! start.

use super::{fold, Call, Model};
use crate::algo::part::npieces;
use crate::algo::schedule::{Layout, Region, Step};
use crate::algo::{generate, generate_keeping_empty, Algo, Params};
use crate::topo::{cpu_of, evenly_oversubscribed, Hosts};
use std::cmp::Reverse;
use rustc_hash::FxHashMap as HashMap;
use std::collections::{BinaryHeap, VecDeque};

/// What the simulator predicts for one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Seconds from the first rank's start to the last rank's end.
    pub seconds: f64,
    /// Steps simulated, all ranks together.
    pub steps: usize,
}

/// A call to simulate.
#[derive(Clone)]
struct Sim<'a> {
    model: &'a Model,
    hosts: &'a Hosts,
    /// Ranks timed: the first `reps`, rank `r` standing for every rank `q`
    /// with `q % reps == r` ([`super::fold`]).
    reps: usize,
    elem: f64,
    /// Elements per slot.
    slot: usize,
    /// Per rank, per channel: steps.
    sched: Vec<Vec<Vec<Step>>>,
    /// Per rank: where its input and output lie (one buffer in place).
    layout: Vec<Layout>,
    /// Per rank, per channel: next step and the time it may start.
    pc: Vec<Vec<(usize, f64)>>,
    /// Per rank: when its progress thread is free; on GPUs, per rank and
    /// channel (`lanes` a rank), when the channel's stream is.
    cpu: Vec<f64>,
    /// What a rank runs its channels on: one thread, or (on GPUs) a stream
    /// for each of its channels.
    lanes: usize,
    /// Per rank: how much slower its work runs for sharing cores, or
    /// faster for data that stays in cache.
    slow: Vec<f64>,
    /// Per rank: how much of a copy's time (before `slow`) a copy out of
    /// the cache takes: 1 where the call's data fits it anyway and the
    /// rank has a core of its own.
    hot: Vec<f64>,
    /// Per rank: the core time it spends getting a core back to take a
    /// message, before it can work on it; its other channels wait behind.
    wake: Vec<f64>,
    /// Per rank: when it last had its core back for a message.
    woke: Vec<f64>,
    /// Per rank: bytes per second it fetches what a rank of its host sent.
    fetch: Vec<f64>,
    /// Per rank timed: its network link (host × nics + local rank % nics).
    nic: Vec<usize>,
    /// Bytes per second of each network link.
    bw: f64,
    /// Per network link: when it is free, out and in.
    nic_out: Vec<f64>,
    nic_in: Vec<f64>,
    /// Per network link: bytes it carries, out and in.
    sent: Vec<f64>,
    got: Vec<f64>,
    /// On GPUs, per rank timed: when its link inside the host is free, out
    /// and in.
    gpu_out: Vec<f64>,
    gpu_in: Vec<f64>,
    /// Arrival times of the first and last slots of messages not yet
    /// received, per (from, to, channel), ranks as timed.
    wire: HashMap<(usize, usize, usize), VecDeque<(f64, f64)>>,
    /// Channels waiting for a message on (from, to, channel).
    waiting: HashMap<(usize, usize, usize), (usize, usize)>,
}

/// Orders non-negative times in a heap.
fn key(t: f64) -> Reverse<u64> {
    Reverse(t.max(0.0).to_bits())
}

impl Sim<'_> {
    /// Sends `elems` from `from` to `to`, its first slot ready at `first`
    /// and its last at `last`; records when they arrive. Within a host of
    /// CPUs only the hand-off is counted here: moving the bytes is the
    /// receiver's work ([`pull`](Self::pull)); GPUs move them over their
    /// own links, as the network does.
    fn transfer(&mut self, (from, to, ch): (usize, usize, usize), elems: usize, first: f64, last: f64) {
        let bytes = elems as f64 * self.elem;
        let (hf, ht) = (self.hosts.host_of(from), self.hosts.host_of(to));
        let (a, b) = if hf != ht {
            let (nf, nt) = (self.nic[from], self.nic[to % self.reps]);
            self.sent[nf] += bytes;
            self.got[nt] += bytes;
            let (out, into) = (self.nic_out[nf], self.nic_in[nt]);
            let (a, b, free) = self.carry((out, into), self.bw, (elems, first, last), self.model.inter.latency);
            self.nic_out[nf] = free;
            self.nic_in[nt] = free;
            (a, b)
        } else if self.model.streams {
            let (out, into) = (self.gpu_out[from], self.gpu_in[to % self.reps]);
            let bw = self.model.intra.bandwidth;
            let (a, b, free) = self.carry((out, into), bw, (elems, first, last), self.model.intra.latency);
            self.gpu_out[from] = free;
            self.gpu_in[to % self.reps] = free;
            (a, b)
        } else {
            (first + self.model.intra.latency, last + self.model.intra.latency)
        };
        self.wire.entry((from, to % self.reps, ch)).or_default().push_back((a, b));
    }

    /// A message of `elems` over a link free out and in from `free`, at
    /// `bw`: it carries the message once its first slot is ready, and its
    /// last slot cannot leave before it is ready. When its first and last
    /// slots arrive, and when the link is free again: after the message's
    /// bytes, even where they come slower than the link carries them (a
    /// message sent as it is reduced, slot by slot), as the next message
    /// then shares the link with what is left of it.
    fn carry(&self, free: (f64, f64), bw: f64, (elems, first, last): (usize, f64, f64), latency: f64) -> (f64, f64, f64) {
        let slot = elems.min(self.slot) as f64 * self.elem / bw;
        let start = first.max(free.0).max(free.1);
        let busy = start + elems as f64 * self.elem / bw;
        let end = busy.max(last + slot);
        (start + slot + latency, end + latency, busy)
    }

    /// Local work of a step on rank `r`, seconds: the fused steps' second
    /// pass reads what their first just wrote or read, from the cache. So
    /// does a step writing memory that one of the channel's two steps
    /// before (`recent`) has just read to send, as in place a ring's
    /// all-gather writes the piece it sent two steps earlier, and a
    /// reduction in place into such memory (recursive doubling's exchange
    /// of a piece): their lines are still in the cache even where the
    /// call's data spills it. A copy that fuses with the `next` step (a
    /// reduction into the same region, [`Step::fuses_with`]) is part of
    /// that reduction's pass.
    fn work(&self, r: usize, step: &Step, (recent, next): (&[Step], Option<&Step>)) -> f64 {
        let m = self.model;
        let b = |len: usize| len as f64 * self.elem;
        let hot = |len: usize| b(len) / m.copy * self.hot[r];
        let at = |x: Region| self.layout[r].resolve(x);
        // (no cache to find it in: nothing to look for)
        let fresh =
            |x: Region| self.hot[r] < 1.0 && recent.iter().flat_map(Step::reads).any(|y| at(y).overlaps(&at(x)));
        let copy = |dst: Region| if fresh(dst) { hot(dst.len) } else { b(dst.len) / m.copy };
        let reduce = |src: Region, dst: Region| {
            let cached = at(src) == at(dst) && fresh(dst);
            b(dst.len) / m.reduce * if cached { self.hot[r] } else { 1.0 }
        };
        m.step
            + match step {
                Step::Send { src, .. } => b(src.len) / m.copy,
                Step::Recv { dst, .. } => copy(*dst),
                Step::RecvReduce { src, dst, .. } => reduce(*src, *dst),
                Step::RecvReduceSend { src, .. } => b(src.len) / m.reduce,
                Step::RecvReduceCopySend { src, dst, .. } => reduce(*src, *dst) + hot(dst.len),
                Step::RecvCopySend { dst, .. } => copy(*dst) + hot(dst.len),
                Step::Copy { src, dst } if at(*src) == at(*dst) || step.fuses_with(next) => 0.0,
                Step::Copy { src, .. } => b(src.len) / m.copy,
                Step::Reduce { src, .. } => b(src.len) / m.reduce,
                Step::Notify { .. } | Step::Wait { .. } => 0.0,
            }
    }

    /// Seconds rank `r` spends fetching what `step` receives from a rank of
    /// its own host (out of the other core's cache): busy time, which its
    /// other channels cannot use; the message's first slot comes slower.
    /// Across hosts the network moves the bytes, between GPUs their links.
    /// A local step on peers' buffers (shared memory) moves their bytes
    /// between the cores itself, at the same rate.
    fn pull(&self, r: usize, step: &Step) -> f64 {
        if step.is_local() {
            let mut regions = step.reads();
            regions.extend(step.writes());
            let remote = |g: &&Region| g.buf.peer().is_some_and(|q| q != r);
            let elems: usize = regions.iter().filter(remote).map(|g| g.len).sum();
            return elems as f64 / self.fetch[r] * self.elem;
        }
        match step.recv_peer() {
            Some(from) if !self.model.streams && self.hosts.host_of(from) == self.hosts.host_of(r) => {
                let m = self.model;
                let first = if m.first_slot > 0.0 {
                    let most = if m.first_max == 0 { self.slot } else { (m.first_max as f64 / self.elem) as usize };
                    step.len().min(self.slot).min(most.max(1)) as f64 / m.first_slot
                } else {
                    0.0
                };
                (step.len() as f64 / self.fetch[r] + first) * self.elem
            }
            _ => 0.0,
        }
    }

    /// The work of rank `r`'s schedule, seconds, as if alone on a core.
    fn own_work(&self, r: usize) -> f64 {
        let steps = self.sched[r].iter().flat_map(|ch| (0..ch.len()).map(move |i| (ch, i)));
        steps.map(|(ch, i)| self.work(r, &ch[i], (&ch[i.saturating_sub(2)..i], ch.get(i + 1)))).sum()
    }

    /// Ranks time-sharing cores evenly (as many on each, pinned in blocks
    /// of consecutive local ranks, as cclrun places them) get their core
    /// in proportion to their work, over a call of many pieces: a rank
    /// with less to do waits for messages, leaving the core to the others.
    /// A rank's work is then slowed by its core's work over its own rather
    /// than by its core's ranks. That is the same for schedules that give
    /// every rank the same work (ring, recursive doubling) and less for
    /// the inner nodes of a tree (4 ranks on 2 cores, double tree at
    /// 16 MiB, 7 runs: predicted 1.14-1.35x measured with an even split,
    /// 0.95-1.13x this way). Within a piece the ranks of a core work at the
    /// same moments (the same hand-offs start them) and split it evenly, so
    /// a call of `p` pieces per channel goes `1 - 1/p` of the way from the
    /// even split to the split by work (at 2 MiB, 2 pieces a tree:
    /// 0.70-0.75x measured the whole way, 0.77-1.0x half of it).
    fn share_cores_by_work(&mut self, groups: &[Vec<usize>], count: usize, chunk: usize) {
        let cores = self.model.cores;
        for g in groups.iter().filter(|g| evenly_oversubscribed(g.len(), cores)) {
            let own: Vec<f64> = g.iter().map(|&r| self.own_work(r)).collect();
            let core_of = |l: usize| cpu_of(l, g.len(), cores);
            let mut core = vec![0.0; cores];
            for (l, w) in own.iter().enumerate() {
                core[core_of(l)] += w;
            }
            let per = (g.len() / cores) as f64;
            for (l, &r) in g.iter().enumerate() {
                if own[l] > 0.0 {
                    let pieces = npieces(count / self.sched[r].len().max(1), chunk) as f64;
                    let filled = 1.0 - 1.0 / pieces;
                    self.slow[r] *= 1.0 + filled * (core[core_of(l)] / own[l] / per - 1.0);
                }
            }
        }
    }

    /// Runs to the end; the time the last channel finished.
    fn run(&mut self) -> Result<(f64, usize), String> {
        let mut heap = BinaryHeap::new();
        for (r, chans) in self.sched.iter().enumerate() {
            for c in 0..chans.len() {
                heap.push((key(0.0), key(0.0), r, c));
            }
        }
        let (mut end, mut steps) = (0.0f64, 0usize);
        // by when a step can start, then (channels of one rank waiting for
        // its thread) by when it was ready: the executor serves them in turn
        while let Some((Reverse(tb), _, r, c)) = heap.pop() {
            let (pc, t0) = self.pc[r][c];
            let Some(step) = self.sched[r][c].get(pc).cloned() else {
                end = end.max(t0);
                continue;
            };
            // slot by slot: a step starts on its first slot, sends on its
            // first as soon as it is done with it, and ends one slot's share
            // of its work after its last arrived
            let recent = &self.sched[r][c][pc.saturating_sub(2)..pc];
            let next = self.sched[r][c].get(pc + 1);
            let busy = self.work(r, &step, (recent, next)) * self.slow[r] + self.pull(r, &step);
            let per_slot = busy / step.len().div_ceil(self.slot).max(1) as f64;
            let (mut ready, mut last, mut came) = (t0, 0.0f64, 0.0f64);
            let from = step.recv_peer().map(|q| q % self.reps);
            if let Some(from) = from {
                match self.wire.get(&(from, r, c)).and_then(VecDeque::front) {
                    Some(&(f, l)) => (ready, last, came) = (ready.max(f), l, f),
                    None => {
                        self.waiting.insert((from, r, c), (r, c));
                        continue;
                    }
                }
            }
            let lane = r * self.lanes + c % self.lanes;
            let at = ready.max(self.cpu[lane]);
            if at.to_bits() > tb {
                heap.push((key(at), key(ready), r, c)); // something ran first; try again in time order
                continue;
            }
            // a rank sharing a core gets it back for a message: core time,
            // which its other channels wait behind; what came for them
            // before it had the core back comes with it, without another
            let start = if from.is_some() && came > self.woke[r] {
                self.woke[r] = at + self.wake[r];
                self.woke[r]
            } else {
                at
            };
            if let Some(from) = from {
                self.wire.get_mut(&(from, r, c)).and_then(VecDeque::pop_front);
            }
            let done = (start + busy).max(last + per_slot);
            // waiting for slots, the thread serves the other channels
            self.cpu[lane] = start + busy;
            if let Some((to, len)) = step.send_peer().map(|to| (to, step.len())) {
                self.transfer((r, to, c), len, start + per_slot, done);
                if let Some((wr, wc)) = self.waiting.remove(&(r, to % self.reps, c)) {
                    let t = self.pc[wr][wc].1;
                    heap.push((key(t.max(self.cpu[wr * self.lanes + wc % self.lanes])), key(t), wr, wc));
                }
            }
            self.pc[r][c] = (pc + 1, done);
            steps += 1;
            heap.push((key(done), key(done), r, c));
        }
        if let Some(((from, to, c), _)) = self.waiting.iter().next() {
            return Err(format!("rank {to} waits forever for rank {from} on channel {c}"));
        }
        Ok((end, steps))
    }
}

/// The most steps (all ranks timed together) one simulation may take,
/// estimated from rank 0's schedule. Longer schedules (a flat ring over
/// thousands of ranks of unequal hosts, which cannot be folded) are not
/// timed: they are errors, and the tuner does not consider them.
pub const MAX_STEPS: usize = 4_000_000;

/// Steps (all ranks timed together) above which a call of many pieces is
/// timed as two shorter calls of the same pieces, and its time read off
/// the line through theirs.
const LINE_STEPS: usize = 250_000;

/// Pieces per channel the shorter of those two calls keeps at least: past
/// the pipeline's filling, where each further piece adds as much.
const LINE_PIECES: usize = 8;

/// Times `algo` running `call` on `hosts` under `model`. Every rank's
/// schedule is generated and all run together; where a symmetry of the
/// hosts maps the ranks onto each other, one rank of each class (see
/// the module's notes). A call of many steps (a quarter of a million),
/// most of them its pieces', is timed at two shorter counts of the same
/// pieces, and its time extended along the line through theirs: once the
/// pipeline is full, each piece adds the same time.
pub fn simulate(call: &Call, algo: Algo, hosts: &Hosts, model: &Model) -> Result<Prediction, String> {
    let whole = call.count;
    let steps = |count: usize| -> Result<usize, String> {
        let reps = fold::classes(call.coll, algo, count, call.channels, hosts);
        Ok(schedule(&Call { count, ..*call }, algo, hosts, reps, 0)?.0.iter().map(Vec::len).sum::<usize>() * reps)
    };
    let all = steps(whole)?;
    if all > LINE_STEPS {
        if let Some((c1, c2)) = shorter(call, all) {
            if steps(c2)? <= 2 * LINE_STEPS {
                let (a, b) = (timed(&Call { count: c1, ..*call }, algo, hosts, model, whole)?, timed(&Call { count: c2, ..*call }, algo, hosts, model, whole)?);
                let line = |a: f64, b: f64| b + (whole - c2) as f64 * (b - a) / (c2 - c1) as f64;
                let t = Timed {
                    fast: line(a.fast, b.fast),
                    slow: line(a.slow, b.slow),
                    busiest: line(a.busiest, b.busiest),
                    steps: a.steps + b.steps,
                };
                return Ok(t.prediction(model));
            }
        }
    }
    Ok(timed(call, algo, hosts, model, whole)?.prediction(model))
}

/// The two shorter counts [`simulate`] times a call of `steps` steps at:
/// its count halved until about [`LINE_STEPS`] steps are left, and halved
/// once more, so that a count that splits evenly into pieces, channels
/// and ranks still does; the shorter at least [`LINE_PIECES`] pieces a
/// channel. `None` where the call has too few pieces.
fn shorter(call: &Call, steps: usize) -> Option<(usize, usize)> {
    let mut halvings = 1;
    while steps >> halvings > LINE_STEPS {
        halvings += 1;
    }
    let c2 = call.count >> halvings;
    let c1 = c2 / 2;
    (c1 >= LINE_PIECES * call.channels.max(1) * call.chunk.max(1)).then_some((c1, c2))
}

/// One run's times: at the link's peak rate where a token bucket shapes
/// it, else as `slow`; at the link's rate; and the busiest link's bytes.
struct Timed {
    fast: f64,
    slow: f64,
    busiest: f64,
    steps: usize,
}

impl Timed {
    fn prediction(&self, model: &Model) -> Prediction {
        // links shaped by a token bucket, in a run of such calls: no faster
        // than at its peak, nor than the busiest link's bytes at its rate;
        // and the time at its rate less the idle time whose tokens the
        // bucket holds
        let seconds = match model.bucket {
            None => self.slow,
            Some(b) => {
                let rate = model.inter.bandwidth;
                self.fast.max(self.busiest / rate).max(self.slow - b.burst / rate)
            }
        };
        Prediction { seconds, steps: self.steps }
    }
}

/// The channels of rank `rank`, one of the first `reps` timed for all,
/// and its layout.
fn schedule(call: &Call, algo: Algo, hosts: &Hosts, reps: usize, rank: usize) -> Result<(Vec<Vec<Step>>, Layout), String> {
    let &Call { coll, count, root, channels, chunk, in_place, .. } = call;
    let n = hosts.nranks();
    let p = Params { nranks: n, rank, count, root, channels, chunk, in_place, around: false, hosts, blocks: None };
    // folded, every rank keeps its empty steps, so that they match its
    // images'; but not a channel with nothing to move, empty on every rank
    // alike (channels split the count the same way on all)
    let s = if reps < n {
        let mut s = generate_keeping_empty(coll, algo, &p)?;
        for ch in s.channels.iter_mut().filter(|ch| ch.iter().all(Step::is_empty)) {
            ch.clear();
        }
        s
    } else {
        generate(coll, algo, &p)?
    };
    Ok((s.channels, coll.layout(n, rank, count, root, in_place)))
}

/// Times `call`, its ranks folded where they can be, the cache and the
/// cores' sharing as for a call of `whole` elements.
fn timed(call: &Call, algo: Algo, hosts: &Hosts, model: &Model, whole: usize) -> Result<Timed, String> {
    let reps = fold::classes(call.coll, algo, call.count, call.channels, hosts);
    timed_ranks(call, algo, hosts, model, reps, whole)
}

/// [`timed`], timing the first `reps` ranks for all.
fn timed_ranks(call: &Call, algo: Algo, hosts: &Hosts, model: &Model, reps: usize, whole: usize) -> Result<Timed, String> {
    let &Call { elem: elem_size, chunk, slot, .. } = call;
    let n = hosts.nranks();
    if reps == 0 || reps > n {
        return Err(format!("{algo} on {n} ranks: no ranks to time"));
    }
    let (mut sched, mut layout) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for rank in 0..reps {
        let (s, l) = schedule(call, algo, hosts, reps, rank)?;
        sched.push(s);
        layout.push(l);
        if rank == 0 {
            let steps = sched[0].iter().map(Vec::len).sum::<usize>().saturating_mul(reps);
            if steps > MAX_STEPS {
                return Err(format!("{algo} on {n} ranks takes ~{steps} steps: too long to simulate"));
            }
        }
    }
    let nics = model.nics.max(1);
    let mut nic = vec![0; reps];
    // the hosts of the ranks timed
    let groups: Vec<Vec<usize>> =
        hosts.groups().iter().map(|g| g.iter().copied().filter(|&r| r < reps).collect::<Vec<_>>()).collect();
    let groups: Vec<Vec<usize>> = groups.into_iter().filter(|g| !g.is_empty()).collect();
    for g in &groups {
        for (l, &r) in g.iter().enumerate() {
            nic[r] = hosts.host_of(r) * nics + l % nics;
        }
    }
    let links = hosts.host_of(reps - 1).saturating_add(1) * nics;
    let (mut slow, mut wake, mut hot) = (vec![1.0; reps], vec![0.0; reps], vec![1.0; reps]);
    // each rank's thread is busy with the call's own work before its first step
    let lanes = if model.streams { sched.iter().map(Vec::len).max().unwrap_or(1).max(1) } else { 1 };
    let mut cpu = vec![model.call; reps * lanes];
    let mut fetch = vec![model.intra.bandwidth; reps];
    for g in &groups {
        let h = model.on_host(g.len(), (whole * elem_size) as f64);
        for &r in g {
            (slow[r], hot[r], wake[r], fetch[r]) = (h.slow, h.hot, h.wake, h.fetch);
            cpu[r * lanes..(r + 1) * lanes].fill(h.call);
        }
    }
    let mut sim = Sim {
        model,
        hosts,
        reps,
        elem: elem_size as f64,
        slot: slot.max(1),
        pc: sched.iter().map(|chans| vec![(0, 0.0); chans.len()]).collect(),
        sched,
        layout,
        cpu,
        lanes,
        slow,
        hot,
        wake,
        woke: vec![f64::NEG_INFINITY; reps],
        fetch,
        nic,
        bw: model.inter.bandwidth,
        nic_out: vec![0.0; links],
        nic_in: vec![0.0; links],
        sent: vec![0.0; links],
        got: vec![0.0; links],
        gpu_out: vec![0.0; reps],
        gpu_in: vec![0.0; reps],
        wire: HashMap::default(),
        waiting: HashMap::default(),
    };
    sim.share_cores_by_work(&groups, whole, chunk);
    let fast = match model.bucket {
        Some(bucket) => Some(Sim { bw: bucket.peak, ..sim.clone() }.run()?.0),
        None => None,
    };
    let (slow, steps) = sim.run()?;
    let busiest = sim.sent.iter().chain(&sim.got).fold(0.0f64, |a, &b| a.max(b));
    Ok(Timed { fast: fast.unwrap_or(slow), slow, busiest, steps })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Coll;
    use crate::sim::Link;

    /// A call of `count` f32 in pieces of `chunk`, through 32 KiB slots.
    fn call(coll: Coll, count: usize, root: usize, channels: usize, chunk: usize) -> Call {
        Call { coll, count, elem: 4, root, channels, chunk, slot: 8 << 10, in_place: true }
    }

    fn model(inter_gbps: f64) -> Model {
        Model::DEFAULT.with_inter(Link { latency: 30e-6, bandwidth: inter_gbps * 1e9 / 8.0 })
    }

    fn time(coll: Coll, algo: Algo, count: usize, hosts: &Hosts, m: &Model) -> f64 {
        simulate(&call(coll, count, 0, 1, 1 << 16), algo, hosts, m).expect("simulates").seconds
    }

    #[test]
    fn folded_ranks_time_as_every_rank_does() {
        // counts that split evenly over channels and ranks: the same to a
        // rounding (ranks ready at the same moment may be served in
        // another order); others within one latency (`fold`)
        let bucket = Model { bucket: Some(crate::sim::Bucket { peak: 4e9, burst: 1e6 }), ..model(8.0) };
        let cases = [
            (Hosts::blocks(&[4; 6]), model(8.0)),
            (Hosts::blocks(&[4; 8]), Model::DEFAULT.with_cores(2)),
            (Hosts::blocks(&[1; 8]), bucket),
            (Hosts::blocks(&[8; 4]), Model { nics: 2, ..Model::H100 }),
        ];
        let mut folded = 0;
        for (hosts, m) in &cases {
            let n = hosts.nranks();
            for coll in Coll::ALL.into_iter().filter(|c| !c.p2p()) {
                for &algo in coll.algos() {
                    for count in [2usize, 1000, 3 << 14, 1 << 16, (1 << 20) + 3, 1 << 20] {
                        if super::fold::classes(coll, algo, count, 2, hosts) == n {
                            continue;
                        }
                        let c = call(coll, count, 0, 2, 1 << 14);
                        let all = timed_ranks(&c, algo, hosts, m, n, count).expect("simulates").prediction(m).seconds;
                        let p = simulate(&c, algo, hosts, m).expect("simulates");
                        let off = (p.seconds / all - 1.0).abs();
                        let even = count.is_multiple_of(2 * n);
                        let most = if even { 0.005 } else { 0.1 };
                        assert!(off < most, "{coll} {algo} {count} on {n}: {} s folded, {all} s", p.seconds);
                        folded += 1;
                    }
                }
            }
        }
        assert!(folded > 50, "{folded}");
    }

    #[test]
    fn a_call_of_many_pieces_is_timed_along_the_line_through_two_shorter_ones() {
        // the time of every piece, against the line through two calls of
        // fewer pieces: trees over many hosts, chains from the root, ranks
        // sharing cores, a token bucket; the same to a rounding where the
        // count splits evenly (all but the last)
        let bucket = Model { bucket: Some(crate::sim::Bucket { peak: 4e9, burst: 1e6 }), ..model(8.0) };
        let cases = [
            (Coll::AllReduce, Algo::Tree, Hosts::blocks(&[8; 32]), Model::H100, 1 << 24, 1 << 13),
            (Coll::Broadcast, Algo::Ring, Hosts::blocks(&[8; 32]), Model::H100, 1 << 24, 1 << 12),
            (Coll::Reduce, Algo::Tree, Hosts::blocks(&[4; 24]), model(100.0), 1 << 22, 1 << 10),
            (Coll::AllReduce, Algo::Ring, Hosts::blocks(&[4]), Model::DEFAULT.with_cores(2), 1 << 22, 1 << 6),
            (Coll::AllReduce, Algo::Tree, Hosts::blocks(&[1; 8]), bucket, 1 << 22, 1 << 7),
            (Coll::AllReduce, Algo::RecursiveDoubling, Hosts::blocks(&[2; 6]), model(25.0), (1 << 22) + 7, 1 << 8),
        ];
        for (coll, algo, hosts, m, count, chunk) in cases {
            let c = Call { slot: chunk / 2, ..call(coll, count, 0, 2, chunk) };
            let p = simulate(&c, algo, &hosts, &m).expect("simulates");
            let all = timed(&c, algo, &hosts, &m, count).expect("simulates");
            assert!(all.steps > LINE_STEPS && p.steps < all.steps, "{coll} {algo}: {} steps of {}", p.steps, all.steps);
            let t = all.prediction(&m).seconds;
            assert!((p.seconds / t - 1.0).abs() < 1e-3, "{coll} {algo} on {}: {} s, every piece {t} s", hosts.nranks(), p.seconds);
        }
    }

    #[test]
    fn ring_all_reduce_matches_the_alpha_beta_formula() {
        // one rank per host: 2(n-1)/n of the data crosses each link; each
        // piece's reduction adds to the path (store and forward)
        let hosts = Hosts::blocks(&[1; 4]);
        let m = model(8.0);
        let count = 1 << 22;
        let t = time(Coll::AllReduce, Algo::Ring, count, &hosts, &m);
        let wire = 2.0 * 3.0 / 4.0 * (count * 4) as f64 / m.inter.bandwidth;
        assert!(t > wire && t < 1.5 * wire, "t={t} wire={wire}");
    }

    #[test]
    fn fetching_from_another_core_keeps_the_receiver_busy() {
        // 2 ranks of one host: ring and the double tree (two channels) move
        // the same bytes through each rank; a second channel cannot hide
        // the time a rank spends pulling data out of the other core
        let hosts = Hosts::flat(2);
        let m = Model { intra: Link { latency: 0.2e-6, bandwidth: 5e9 }, ..model(10.0) };
        let t = |a| simulate(&call(Coll::AllReduce, 1 << 20, 0, 1, 1 << 16), a, &hosts, &m).expect("simulates").seconds;
        let (ring, tree) = (t(Algo::Ring), t(Algo::Tree));
        assert!(tree > 0.97 * ring, "ring {ring} tree {tree}");
        // and it is counted: each rank pulls 4 MiB at 5 GB/s
        assert!(ring > (4 << 20) as f64 / 5e9, "ring {ring}");
    }

    #[test]
    fn small_calls_prefer_few_steps_and_large_ones_bandwidth() {
        let hosts = Hosts::blocks(&[1; 8]);
        let m = model(10.0);
        let small = |a| time(Coll::AllReduce, a, 16, &hosts, &m);
        assert!(small(Algo::RecursiveDoubling) < small(Algo::Ring));
        let big = |a| time(Coll::AllReduce, a, 1 << 22, &hosts, &m);
        assert!(big(Algo::Ring) < big(Algo::RecursiveDoubling));
    }

    #[test]
    fn hierarchical_wins_across_slow_links() {
        // 4 hosts of 4: ring-ring sends 1/4 as much over each host's link as a flat ring
        let hosts = Hosts::blocks(&[4; 4]);
        let count = 1 << 22;
        let slow = model(1.0);
        let rr = time(Coll::AllReduce, Algo::RingRing, count, &hosts, &slow);
        let ring = time(Coll::AllReduce, Algo::Ring, count, &hosts, &slow);
        assert!(rr < ring, "ring-ring {rr} vs ring {ring}");
    }

    #[test]
    fn data_that_fits_the_cache_runs_faster_and_less_so_on_shared_cores() {
        let count = 1 << 18; // 1 MiB of f32 per rank
        let uncached = Model { cache: 0.0, cached: 1.0, shared_cached: 1.0, ..Model::DEFAULT };
        let cached = Model { cache: 64.0 * (1 << 20) as f64, cached: 2.0, shared_cached: 1.5, ..uncached };
        let two = Hosts::blocks(&[2]);
        let (cold, warm) = (
            time(Coll::AllReduce, Algo::Ring, count, &two, &uncached),
            time(Coll::AllReduce, Algo::Ring, count, &two, &cached),
        );
        assert!(warm < 0.8 * cold, "in cache {warm} vs not {cold}");
        // data that does not fit: only the fused steps' second pass (the
        // copy of what was just reduced or received) runs from the cache,
        // and in place the ring's all-gather into the piece it sent two
        // steps before
        let too_small = Model { cache: 1.0 * (1 << 20) as f64, ..cached };
        let timed = |algo: Algo, m: &Model, in_place: bool| {
            let c = Call { in_place, ..call(Coll::AllReduce, count, 0, 1, 1 << 16) };
            simulate(&c, algo, &two, m).expect("simulates").seconds
        };
        let (partly, in_place) = (timed(Algo::Ring, &too_small, false), timed(Algo::Ring, &too_small, true));
        assert!(
            warm < in_place && in_place < 0.95 * partly && partly < cold,
            "{warm} < {in_place} < {partly} < {cold}"
        );
        // recursive doubling has no fused pass: out of place it gains
        // nothing, in place its reductions into what each step has just
        // sent run from the cache
        let rd = |m: &Model, in_place: bool| timed(Algo::RecursiveDoubling, m, in_place);
        assert_eq!(rd(&too_small, false), rd(&uncached, false));
        assert!(
            rd(&too_small, true) < 0.8 * rd(&uncached, true),
            "{} vs {}",
            rd(&too_small, true),
            rd(&uncached, true)
        );
        assert_eq!(rd(&uncached, true), rd(&uncached, false), "no cache, no difference");
        // ranks time-sharing cores get the shared cache's smaller speed-up
        // (fetching from other cores at copy speed, which is what a slot
        // evicted while it waits costs: that alone would tell them apart)
        let four = Hosts::blocks(&[4]);
        let shared = |m: Model| time(Coll::AllReduce, Algo::Ring, count, &four, &m.with_cores(2));
        let fetch_at_copy = |m: Model| Model { intra: Link { bandwidth: m.copy, ..m.intra }, ..m };
        let spilt = shared(fetch_at_copy(too_small));
        let kept = shared(fetch_at_copy(cached));
        let as_if_alone = shared(fetch_at_copy(Model { shared_cached: cached.cached, ..cached }));
        assert!(as_if_alone < kept && kept < spilt, "{as_if_alone} < {kept} < {spilt}");
        assert_eq!(spilt, shared(fetch_at_copy(Model { shared_cached: 1.0, ..cached })), "no speed-up of 1");
    }

    #[test]
    fn a_token_bucket_passes_small_calls_at_its_peak_and_holds_large_ones_to_its_rate() {
        // 4 hosts of one rank, links of 0.1 GB/s shaped by a 1 MiB bucket
        // that sends at 10 GB/s while it lasts
        let hosts = Hosts::blocks(&[1; 4]);
        let rate = 0.1e9;
        let plain = model(rate * 8.0 / 1e9);
        let bucket = |burst: f64| Model { bucket: Some(crate::sim::Bucket { peak: 10e9, burst }), ..plain };
        let peak = model(80.0);
        let t = |count: usize, algo: Algo, m: &Model| time(Coll::AllReduce, algo, count, &hosts, m);
        // a few bytes: as fast as at its peak
        for algo in [Algo::Ring, Algo::RecursiveDoubling] {
            assert_eq!(t(4, algo, &bucket(1e6)), t(4, algo, &peak), "{algo}");
        }
        // 16 KiB a call (ring: 24 KiB out of every host): its rate, on
        // average, which the latencies between a call's steps do not add to
        let wire = 2.0 * 3.0 / 4.0 * (16 << 10) as f64 / rate;
        let (shaped, small) = (t(4 << 10, Algo::Ring, &bucket(1e6)), t(4 << 10, Algo::Ring, &plain));
        assert!((shaped - wire).abs() < 1e-9 && small > wire + 5.0 * plain.inter.latency, "{shaped} {wire} {small}");
        // far more than the bucket holds: the plain link's time, less the
        // bucket's worth of it at most
        let count = 16 << 20;
        let (shaped, rated) = (t(count, Algo::Ring, &bucket(1e6)), t(count, Algo::Ring, &plain));
        assert!(shaped <= rated && shaped >= rated - 1e6 / rate, "{shaped} {rated}");
        // a bucket of a byte: a plain link
        let tiny = t(4 << 10, Algo::Ring, &bucket(1.0));
        assert!((tiny - small).abs() < 1e-7, "{tiny} {small}");
    }

    #[test]
    fn a_message_s_first_slot_comes_slower_from_another_core() {
        // 2 ranks of one host: recursive doubling exchanges one message
        // each way; the receiver fetches its first slot at `first_slot`
        let hosts = Hosts::blocks(&[2]);
        let (slot, none) = (8 << 10, Model { first_slot: 0.0, first_max: 0, ..Model::DEFAULT });
        let slowly = Model { first_slot: 1e9, ..none };
        let t = |count: usize, m: &Model| {
            let c = Call { slot, ..call(Coll::AllReduce, count, 0, 1, count) };
            simulate(&c, Algo::RecursiveDoubling, &hosts, m).expect("simulates").seconds
        };
        let one_slot = (slot * 4) as f64 / 1e9;
        for count in [slot / 2, slot, 16 * slot] {
            // as large as the message up to a slot, once per message (one
            // piece here)
            let extra = t(count, &slowly) - t(count, &none);
            let want = one_slot * (count.min(slot) as f64 / slot as f64);
            assert!((extra - want).abs() < 1e-3 * want, "{count} elements: {extra} s more, not {want}");
        }
        // at most `first_max` bytes of it, however large the slot
        let capped = Model { first_max: (slot / 4) * 4, ..slowly };
        let whole = Model { first_max: 0, ..slowly };
        let count = 16 * slot;
        let extra = t(count, &capped) - t(count, &none);
        assert!((extra - one_slot / 4.0).abs() < 1e-3 * one_slot, "capped: {extra} s more");
        let extra = t(count, &whole) - t(count, &none);
        assert!((extra - one_slot).abs() < 1e-3 * one_slot, "uncapped: {extra} s more");
    }

    #[test]
    fn slots_waiting_for_a_core_come_from_memory_when_the_data_spills_the_cache() {
        // 4 ranks on 2 cores streaming 64 MiB: a slot waits for its
        // receiver to get a core and is evicted meanwhile, so fetching it
        // runs at the speed of a copy however fast cores fetch from each other
        let four = Hosts::blocks(&[4]);
        let count = 1 << 21;
        let (fast, faster) =
            (Model::DEFAULT, Model { intra: Link { latency: 0.2e-6, bandwidth: 1e12 }, ..Model::DEFAULT });
        let t = |m: Model| time(Coll::AllReduce, Algo::Ring, count, &four, &m);
        assert_eq!(t(fast.with_cores(2)), t(faster.with_cores(2)));
        // ranks with cores of their own read each other's slots in time
        assert!(t(faster.with_cores(4)) < t(fast.with_cores(4)));
        // and so do time-sharing ranks whose data stays in the cache
        let roomy = |m: Model| Model { cache: 1e9, ..m }.with_cores(2);
        assert!(t(roomy(faster)) < t(roomy(fast)));
    }

    #[test]
    fn hand_offs_wait_for_a_core_only_where_ranks_share_them() {
        let (switching, none) = (Model { switch: 20e-6, ..Model::DEFAULT }, Model { switch: 0.0, ..Model::DEFAULT });
        let t = |n: usize, cores: usize, m: Model| {
            time(Coll::AllReduce, Algo::RecursiveDoubling, 16, &Hosts::blocks(&[n]), &m.with_cores(cores))
        };
        assert_eq!(t(2, 2, switching), t(2, 2, none));
        // 4 ranks on 2 cores: every hand-off waits half a switch, and rd has two rounds
        let extra = t(4, 2, switching) - t(4, 2, none);
        assert!((extra - 2.0 * 10e-6).abs() < 1e-9, "extra {extra}");
    }

    #[test]
    fn one_wake_up_takes_what_came_for_every_channel() {
        // getting a core back is the rank's own time, which its other
        // channels wait behind; but what came for them before it had the
        // core back comes with it (the double tree on 4 ranks sharing 2
        // cores, 8 B-4 KiB, 7 runs: predicted 1.13-1.29x measured when
        // every message cost a wake-up of its own, 0.78-1.06x this way)
        let (switching, none) = (Model { switch: 20e-6, ..Model::DEFAULT }, Model { switch: 0.0, ..Model::DEFAULT });
        let four = Hosts::blocks(&[4]);
        let extra = |algo: Algo, channels: usize| {
            let t = |m: Model| {
                let c = call(Coll::AllReduce, 64, 0, channels, 64);
                simulate(&c, algo, &four, &m.with_cores(2)).expect("simulates").seconds
            };
            t(switching) - t(none)
        };
        // one channel: a ring of 4 hands off 6 times in a row, half a switch each
        let one = extra(Algo::Ring, 1);
        assert!((one - 6.0 * 10e-6).abs() < 1e-9, "one channel: {one} s more");
        // two in step: their messages come together, one wake-up each round
        let two = extra(Algo::Ring, 2);
        assert!((two - one).abs() < 1e-8, "two channels: {two} s more, one: {one} s more");
        // the double tree's two trees: its longest chain of hand-offs, up
        // two levels and down two
        let tree = extra(Algo::Tree, 1);
        assert!((tree - 4.0 * 10e-6).abs() < 1e-9, "double tree: {tree} s more");
    }

    #[test]
    fn ranks_sharing_a_core_get_it_in_proportion_to_their_work() {
        // 4 ranks, no cache, fetching and hand-offs free: the time is the
        // ranks' work. On 2 cores a ring, whose ranks all work alike, takes
        // twice as long as with a core each; the double tree's inner ranks
        // work about twice as hard as the others, and the rank beside each,
        // with less to do, leaves it the core most of the time: less than
        // twice
        let free = Model {
            intra: Link { latency: 0.0, bandwidth: 1e15 },
            first_slot: 0.0,
            cache: 0.0,
            switch: 0.0,
            ..Model::DEFAULT
        };
        let four = Hosts::blocks(&[4]);
        let t = |algo: Algo, cores: usize| time(Coll::AllReduce, algo, 1 << 22, &four, &free.with_cores(cores));
        let ring = t(Algo::Ring, 2) / t(Algo::Ring, 4);
        assert!((ring - 2.0).abs() < 0.02, "ring: {ring}x on 2 cores");
        let tree = t(Algo::Tree, 2) / t(Algo::Tree, 4);
        assert!(tree > 1.2 && tree < 1.7, "double tree: {tree}x on 2 cores");
        // ranks that do not split evenly over the cores (as the kernel
        // places them, unpinned) each get an even share
        let three = Hosts::blocks(&[3]);
        let t3 = |cores: usize| time(Coll::AllReduce, Algo::Ring, 3 << 20, &three, &free.with_cores(cores));
        let ring3 = t3(2) / t3(3);
        assert!((ring3 - 1.5).abs() < 0.02, "3 ranks on 2 cores: {ring3}x");
    }

    #[test]
    fn a_call_s_own_work_comes_once_and_slows_with_shared_cores() {
        // the same for every algorithm and size: once per call, not per step
        let (with, none) = (Model { call: 1e-6, ..Model::DEFAULT }, Model { call: 0.0, ..Model::DEFAULT });
        let t = |n: usize, cores: usize, algo: Algo, count: usize, m: Model| {
            time(Coll::AllReduce, algo, count, &Hosts::blocks(&[n]), &m.with_cores(cores))
        };
        for algo in [Algo::Ring, Algo::RecursiveDoubling, Algo::Tree] {
            for count in [2, 1 << 16] {
                let extra = t(2, 2, algo, count, with) - t(2, 2, algo, count, none);
                assert!((extra - 1e-6).abs() < 1e-9, "{algo} {count}: {extra} s more");
                // 4 ranks on 2 cores: each rank gets half a core for it
                let extra = t(4, 2, algo, count, with) - t(4, 2, algo, count, none);
                assert!((extra - 2e-6).abs() < 1e-9, "{algo} {count} on shared cores: {extra} s more");
            }
        }
    }

    #[test]
    fn a_message_moves_slot_by_slot_along_a_chain() {
        // a ring broadcast of one piece over 8 hosts is a chain of 7 hops:
        // each forwards a slot as soon as it has it, so the chain costs the
        // piece once plus a slot per hop, not the piece per hop
        let hosts = Hosts::blocks(&[1; 8]);
        let m = model(8.0);
        let count = 1 << 20;
        let t = |slot: usize| {
            let c = Call { slot, ..call(Coll::Broadcast, count, 0, 1, count) };
            simulate(&c, Algo::Ring, &hosts, &m).expect("simulates").seconds
        };
        let piece = (count * 4) as f64 / m.inter.bandwidth;
        let (whole, slotted) = (t(count), t(count / 64));
        assert!(whole > 7.0 * piece, "one slot per piece: {whole} s, a piece takes {piece} s");
        assert!(slotted < 1.3 * piece, "64 slots per piece: {slotted} s, a piece takes {piece} s");
    }

    #[test]
    fn channels_of_one_rank_take_turns() {
        // the double tree's two channels share each rank's thread: cutting
        // pieces into slots lets steps start sooner, and must not let one
        // channel keep the thread while the other's steps wait behind it
        // (4 ranks on 2 cores, 2 MiB: served highest channel first, the
        // slotted call took 1.08x as long as the unslotted one)
        // (the first slot of a message, however large, comes slower, as
        // when this was measured)
        let hosts = Hosts::blocks(&[4]);
        let m = Model { first_max: 0, ..Model::DEFAULT.with_cores(2) };
        let t = |slot: usize| {
            let c = Call { slot, ..call(Coll::AllReduce, 1 << 19, 0, 1, 1 << 17) };
            simulate(&c, Algo::Tree, &hosts, &m).expect("simulates").seconds
        };
        let (whole, slotted) = (t(1 << 17), t(8 << 10));
        assert!(slotted < whole, "slots {slotted} s vs whole pieces {whole} s");
    }

    #[test]
    fn on_gpus_channels_work_at_once_and_share_the_link() {
        // a ring over 4 ranks of one host, on 1 and 4 channels: where the
        // work is all (links free), a CPU rank's thread does its channels'
        // in turn, a GPU's streams at once; where the link is all (work
        // free), the GPU's channels share it, the CPU's fetch their bytes
        // on the one thread. The streams also overlap the link with the
        // work, where the thread does one after the other.
        let hosts = Hosts::blocks(&[4]);
        let free = 1e18;
        let base = Model { intra: Link { latency: 0.0, bandwidth: 10e9 }, first_slot: 0.0, step: 0.0, cache: 0.0, ..Model::H100 };
        let work = Model { intra: Link { latency: 0.0, bandwidth: free }, copy: 20e9, reduce: 10e9, ..base };
        let link = Model { copy: free, reduce: free, ..base };
        let t = |m: &Model, streams: bool, channels: usize| {
            let c = call(Coll::AllReduce, 1 << 22, 0, channels, 1 << 16);
            simulate(&c, Algo::Ring, &hosts, &Model { streams, ..*m }).expect("simulates").seconds
        };
        let near = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
        assert!(near(t(&work, false, 4), t(&work, false, 1)), "a thread serves its channels in turn");
        assert!(near(t(&work, true, 4) * 4.0, t(&work, true, 1)), "streams work at once");
        assert!(near(t(&link, true, 4), t(&link, true, 1)), "the channels share the GPU's link");
        assert!(near(t(&link, false, 4), t(&link, false, 1)), "a thread fetches its channels' bytes in turn");
        let both = Model { copy: 40e9, reduce: 20e9, ..base };
        let (gpu, cpu) = (t(&both, true, 1), t(&both, false, 1));
        let half = Model { copy: 40e9, reduce: 20e9, ..work };
        assert!(near(gpu, t(&link, true, 1)), "the link hides the work: {gpu} s");
        assert!(near(cpu, t(&link, false, 1) + t(&half, false, 1)), "one after the other: {cpu} s");
    }

    #[test]
    fn every_generator_simulates_to_the_end() {
        for n in [1usize, 2, 3, 5, 8] {
            let hosts = Hosts::blocks(&[n.div_ceil(2), n / 2].into_iter().filter(|&s| s > 0).collect::<Vec<_>>());
            // send and recv pair across two calls: nothing to time alone
            for coll in Coll::ALL.into_iter().filter(|c| !matches!(c, Coll::Send | Coll::Recv)) {
                for &algo in coll.algos() {
                    let r = simulate(&call(coll, 1000, n - 1, 2, 64), algo, &hosts, &model(10.0));
                    let p = r.unwrap_or_else(|e| panic!("{coll} {algo} n={n}: {e}"));
                    assert!(p.seconds >= 0.0 && p.seconds.is_finite());
                }
            }
        }
    }
}
