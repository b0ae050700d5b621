//! Timing every rank's schedule together, in order of when each step can
//! start.

use super::Model;
use crate::algo::schedule::Step;
use crate::algo::{generate, Algo, Coll, Params};
use crate::topo::Hosts;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// What the simulator predicts for one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Seconds from the first rank's start to the last rank's end.
    pub seconds: f64,
    /// Steps simulated, all ranks together.
    pub steps: usize,
}

/// A call to simulate.
struct Sim<'a> {
    model: &'a Model,
    hosts: &'a Hosts,
    elem: f64,
    /// Per rank, per channel: steps.
    sched: Vec<Vec<Vec<Step>>>,
    /// Per rank, per channel: next step and the time it may start.
    pc: Vec<Vec<(usize, f64)>>,
    /// Per rank: when its progress thread is free.
    cpu: Vec<f64>,
    /// Per rank: how much slower its work runs for sharing cores, or
    /// faster for data that stays in cache.
    slow: Vec<f64>,
    /// Per rank: how much of a copy's time (before `slow`) a copy out of
    /// the cache takes: 1 where the call's data fits it anyway.
    hot: Vec<f64>,
    /// Per rank: how long a message to it waits for it to get a core.
    wake: Vec<f64>,
    /// Per rank: its network link (host × nics + local rank % nics).
    nic: Vec<usize>,
    /// Per network link: when it is free, out and in.
    nic_out: Vec<f64>,
    nic_in: Vec<f64>,
    /// Arrival times of messages not yet received, per (from, to, channel).
    wire: HashMap<(usize, usize, usize), VecDeque<f64>>,
    /// Channels waiting for a message on (from, to, channel).
    waiting: HashMap<(usize, usize, usize), (usize, usize)>,
}

/// Orders non-negative times in a heap.
fn key(t: f64) -> Reverse<u64> {
    Reverse(t.max(0.0).to_bits())
}

impl Sim<'_> {
    /// Sends `elems` from `from` to `to` at time `t`; when it arrives.
    /// Within a host only the hand-off is counted here: moving the bytes
    /// is the receiver's work ([`pull`](Self::pull)).
    fn transfer(&mut self, from: usize, to: usize, ch: usize, elems: usize, t: f64) {
        let bytes = elems as f64 * self.elem;
        let (hf, ht) = (self.hosts.host_of(from), self.hosts.host_of(to));
        let arrive = self.wake[to]
            + if hf == ht {
                t + self.model.intra.latency
            } else {
                let (nf, nt) = (self.nic[from], self.nic[to]);
                let start = t.max(self.nic_out[nf]).max(self.nic_in[nt]);
                let end = start + bytes / self.model.inter.bandwidth;
                self.nic_out[nf] = end;
                self.nic_in[nt] = end;
                end + self.model.inter.latency
            };
        self.wire.entry((from, to, ch)).or_default().push_back(arrive);
    }

    /// Local work of a step on rank `r`, seconds: the fused steps' second
    /// pass reads what their first just wrote or read, from the cache.
    fn work(&self, r: usize, step: &Step) -> f64 {
        let m = self.model;
        let b = |len: usize| len as f64 * self.elem;
        let hot = |len: usize| b(len) / m.copy * self.hot[r];
        m.step
            + match step {
                Step::Send { src, .. } => b(src.len) / m.copy,
                Step::Recv { dst, .. } => b(dst.len) / m.copy,
                Step::RecvReduce { dst, .. } => b(dst.len) / m.reduce,
                Step::RecvReduceSend { src, .. } => b(src.len) / m.reduce,
                Step::RecvReduceCopySend { dst, .. } => b(dst.len) / m.reduce + hot(dst.len),
                Step::RecvCopySend { dst, .. } => b(dst.len) / m.copy + hot(dst.len),
                Step::Copy { src, dst } if src == dst => 0.0,
                Step::Copy { src, .. } => b(src.len) / m.copy,
                Step::Reduce { src, .. } => b(src.len) / m.reduce,
            }
    }

    /// Seconds rank `r` spends fetching what `step` receives from a rank of
    /// its own host (out of the other core's cache): busy time, which its
    /// other channels cannot use. Across hosts the network moves the bytes.
    fn pull(&self, r: usize, step: &Step) -> f64 {
        match step.recv_peer() {
            Some(from) if self.hosts.host_of(from) == self.hosts.host_of(r) => {
                step.len() as f64 * self.elem / self.model.intra.bandwidth
            }
            _ => 0.0,
        }
    }

    /// Runs to the end; the time the last channel finished.
    fn run(&mut self) -> Result<(f64, usize), String> {
        let mut heap = BinaryHeap::new();
        for (r, chans) in self.sched.iter().enumerate() {
            for c in 0..chans.len() {
                heap.push((key(0.0), r, c));
            }
        }
        let (mut end, mut steps) = (0.0f64, 0usize);
        while let Some((Reverse(tb), r, c)) = heap.pop() {
            let (pc, t0) = self.pc[r][c];
            let Some(step) = self.sched[r][c].get(pc).cloned() else {
                end = end.max(t0);
                continue;
            };
            let mut start = t0.max(self.cpu[r]);
            if let Some(from) = step.recv_peer() {
                match self.wire.get(&(from, r, c)).and_then(VecDeque::front) {
                    Some(&arrive) => start = start.max(arrive),
                    None => {
                        self.waiting.insert((from, r, c), (r, c));
                        continue;
                    }
                }
            }
            if start.to_bits() > tb {
                heap.push((key(start), r, c)); // something ran first; try again in time order
                continue;
            }
            if let Some(from) = step.recv_peer() {
                self.wire.get_mut(&(from, r, c)).and_then(VecDeque::pop_front);
            }
            let done = start + self.work(r, &step) * self.slow[r] + self.pull(r, &step);
            self.cpu[r] = done;
            if let Some((to, len)) = step.send_peer().map(|to| (to, step.len())) {
                self.transfer(r, to, c, len, done);
                if let Some((wr, wc)) = self.waiting.remove(&(r, to, c)) {
                    let t = self.pc[wr][wc].1.max(self.cpu[wr]);
                    heap.push((key(t), wr, wc));
                }
            }
            self.pc[r][c] = (pc + 1, done);
            steps += 1;
            heap.push((key(done), r, c));
        }
        if let Some(((from, to, c), _)) = self.waiting.iter().next() {
            return Err(format!("rank {to} waits forever for rank {from} on channel {c}"));
        }
        Ok((end, steps))
    }
}

/// The most steps (all ranks together) one simulation may take, estimated
/// from rank 0's schedule: about half a second. Longer schedules (a flat
/// ring over thousands of ranks) are not timed: they are errors, and the
/// tuner does not consider them.
pub const MAX_STEPS: usize = 4_000_000;

/// Times `algo` running `coll` of `count` elements of `elem_size` bytes on
/// `hosts` under `model`, with `channels` channels and pieces of `chunk`
/// elements. Every rank's schedule is generated and all run together.
#[allow(clippy::too_many_arguments)]
pub fn simulate(
    coll: Coll,
    algo: Algo,
    count: usize,
    elem_size: usize,
    root: usize,
    channels: usize,
    chunk: usize,
    hosts: &Hosts,
    model: &Model,
) -> Result<Prediction, String> {
    let n = hosts.nranks();
    let mut sched = Vec::with_capacity(n);
    for rank in 0..n {
        let p = Params { nranks: n, rank, count, root, channels, chunk, in_place: true, hosts };
        sched.push(generate(coll, algo, &p)?.channels);
        if rank == 0 {
            let steps = sched[0].iter().map(Vec::len).sum::<usize>().saturating_mul(n);
            if steps > MAX_STEPS {
                return Err(format!("{algo} on {n} ranks takes ~{steps} steps: too long to simulate"));
            }
        }
    }
    let nics = model.nics.max(1);
    let mut nic = vec![0; n];
    let groups = hosts.groups();
    for (h, g) in groups.iter().enumerate() {
        for (l, &r) in g.iter().enumerate() {
            nic[r] = h * nics + l % nics;
        }
    }
    let links = groups.len() * nics;
    let (mut slow, mut wake, mut hot) = (vec![1.0; n], vec![0.0; n], vec![1.0; n]);
    for g in &groups {
        let share = if model.cores > 0 { g.len() as f64 / model.cores as f64 } else { 1.0 };
        // every local rank's input and output
        let data = (2 * g.len() * count) as f64 * elem_size as f64;
        // ranks time-sharing cores evict each other's data: no cache speed-up
        let fits = model.cache > 0.0 && data <= model.cache && share <= 1.0;
        let speed = if fits { model.cached.max(f64::MIN_POSITIVE) } else { 1.0 };
        for &r in g {
            slow[r] = share.max(1.0) / speed;
            hot[r] = if fits || model.cache <= 0.0 { 1.0 } else { 1.0 / model.cached.max(1.0) };
            wake[r] = if share > 1.0 { model.switch * (1.0 - 1.0 / share) } else { 0.0 };
        }
    }
    let mut sim = Sim {
        model,
        hosts,
        elem: elem_size as f64,
        pc: sched.iter().map(|chans| vec![(0, 0.0); chans.len()]).collect(),
        sched,
        cpu: vec![0.0; n],
        slow,
        hot,
        wake,
        nic,
        nic_out: vec![0.0; links],
        nic_in: vec![0.0; links],
        wire: HashMap::new(),
        waiting: HashMap::new(),
    };
    let (seconds, steps) = sim.run()?;
    Ok(Prediction { seconds, steps })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Link;

    fn model(inter_gbps: f64) -> Model {
        Model::DEFAULT.with_inter(Link { latency: 30e-6, bandwidth: inter_gbps * 1e9 / 8.0 })
    }

    fn time(coll: Coll, algo: Algo, count: usize, hosts: &Hosts, m: &Model) -> f64 {
        simulate(coll, algo, count, 4, 0, 1, 1 << 16, hosts, m).expect("simulates").seconds
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
        let t = |a| simulate(Coll::AllReduce, a, 1 << 20, 4, 0, 1, 1 << 16, &hosts, &m).expect("simulates").seconds;
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
    fn data_that_fits_the_cache_runs_faster_unless_ranks_share_cores() {
        let count = 1 << 18; // 1 MiB of f32 per rank
        let uncached = Model { cache: 0.0, cached: 1.0, ..Model::DEFAULT };
        let cached = Model { cache: 64.0 * (1 << 20) as f64, cached: 2.0, ..uncached };
        let two = Hosts::blocks(&[2]);
        let (cold, warm) = (
            time(Coll::AllReduce, Algo::Ring, count, &two, &uncached),
            time(Coll::AllReduce, Algo::Ring, count, &two, &cached),
        );
        assert!(warm < 0.8 * cold, "in cache {warm} vs not {cold}");
        // data that does not fit: only the fused steps' second pass (the
        // copy of what was just reduced or received) runs from the cache
        let too_small = Model { cache: 1.0 * (1 << 20) as f64, ..cached };
        let partly = time(Coll::AllReduce, Algo::Ring, count, &two, &too_small);
        assert!(warm < partly && partly < cold, "{warm} < {partly} < {cold}");
        let no_fused_pass = time(Coll::AllReduce, Algo::RecursiveDoubling, count, &two, &too_small);
        assert_eq!(no_fused_pass, time(Coll::AllReduce, Algo::RecursiveDoubling, count, &two, &uncached));
        let four = Hosts::blocks(&[4]);
        let shared = |m: Model| time(Coll::AllReduce, Algo::Ring, count, &four, &m.with_cores(2));
        assert_eq!(shared(cached), shared(too_small), "time-sharing ranks evict each other");
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
    fn every_generator_simulates_to_the_end() {
        for n in [1usize, 2, 3, 5, 8] {
            let hosts = Hosts::blocks(&[n.div_ceil(2), n / 2].into_iter().filter(|&s| s > 0).collect::<Vec<_>>());
            // send and recv pair across two calls: nothing to time alone
            for coll in Coll::ALL.into_iter().filter(|c| !matches!(c, Coll::Send | Coll::Recv)) {
                for &algo in coll.algos() {
                    let r = simulate(coll, algo, 1000, 4, n - 1, 2, 64, &hosts, &model(10.0));
                    let p = r.unwrap_or_else(|e| panic!("{coll} {algo} n={n}: {e}"));
                    assert!(p.seconds >= 0.0 && p.seconds.is_finite());
                }
            }
        }
    }
}
