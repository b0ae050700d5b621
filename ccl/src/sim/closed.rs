//! The closed-form cost model: a call's time from a formula per collective
//! and algorithm, in microseconds at any rank count, where the simulator
//! ([`super::simulate`]) times every step of every rank.
//!
//! It reads the same [`Model`] and prices the same things, per step of a
//! rank's schedule: the fixed per-step work, the bytes a step copies or
//! reduces (on a core of its own or sharing one, in the cache or not), the
//! bytes a receiver fetches from another core of its host (its first slot
//! slower), a hop's latency, the bytes a network link carries (shared by
//! the channels and the ranks of a host that cross at once), and a core
//! handed back to a rank that shares one. What it does not follow step by
//! step it takes in aggregate: a pipeline of `q` pieces through `d`
//! dependent hops costs `d` hops (latency and first slot) plus `q` times
//! the slowest stage; each step of a ring takes the longer of a rank's
//! work at the ring's slowest hop and the hop from its predecessor.

use super::{Call, Model};
use crate::algo::{Algo, Coll};
use crate::topo::Hosts;

/// What one step of a schedule does with its bytes (the simulator's
/// `work` by step kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Receive and reduce into a slot for the next rank (reduce-scatter).
    ReduceSend,
    /// Receive and copy out, and on (all-gather, broadcast).
    CopySend,
    /// Send a piece and reduce the peer's into the output (recursive
    /// doubling and halving).
    Exchange,
    /// Send a piece and copy the peer's out (recursive doubling).
    ExchangeCopy,
    /// Receive and copy out, or copy into a slot to send.
    Copy,
}

/// The model's rates as they apply to a call on `hosts`.
struct Rates<'a> {
    m: &'a Model,
    /// Ranks, hosts, and ranks on the largest host.
    n: usize,
    hosts: usize,
    per_host: usize,
    elem: f64,
    /// Bytes per slot.
    slot: f64,
    /// How much slower work runs for sharing cores, or faster for data
    /// that stays in the cache.
    slow: f64,
    /// The share of a copy's time a copy out of the cache takes.
    hot: f64,
    /// Core time to get a core back for a message.
    wake: f64,
    /// Bytes per second a receiver fetches from another core of its host.
    fetch: f64,
    /// Bytes per second of one network link.
    bw: f64,
    channels: f64,
}

impl<'a> Rates<'a> {
    fn new(call: &Call, hosts: &Hosts, m: &'a Model, bw: f64) -> Self {
        let sizes = hosts.sizes();
        let per_host = sizes.iter().copied().max().unwrap_or(1).max(1);
        let on = m.on_host(per_host, (call.count * call.elem) as f64);
        Rates {
            m,
            n: hosts.nranks(),
            hosts: sizes.len().max(1),
            per_host,
            elem: call.elem as f64,
            slot: (call.slot.max(1) * call.elem) as f64,
            slow: on.slow,
            hot: on.hot,
            wake: on.wake,
            fetch: on.fetch,
            bw,
            channels: call.channels.max(1) as f64,
        }
    }

    /// Seconds of a rank's own work on a step of `b` bytes.
    fn work(&self, kind: Kind, b: f64) -> f64 {
        let m = self.m;
        let (steps, per_byte) = match kind {
            Kind::ReduceSend => (1.0, 1.0 / m.reduce),
            Kind::CopySend => (1.0, (1.0 + self.hot) / m.copy),
            Kind::Exchange => (2.0, 1.0 / m.copy + 1.0 / m.reduce),
            Kind::ExchangeCopy => (2.0, 2.0 / m.copy),
            Kind::Copy => (1.0, 1.0 / m.copy),
        };
        (m.step * steps + b * per_byte) * self.slow
    }

    /// Seconds a receiver spends fetching `b` bytes from a rank of its host.
    fn pull(&self, b: f64) -> f64 {
        let m = self.m;
        let first = if m.first_slot > 0.0 {
            let most = if m.first_max == 0 { self.slot } else { m.first_max as f64 };
            b.min(self.slot).min(most) / m.first_slot
        } else {
            0.0
        };
        b / self.fetch + first
    }

    /// One hop of `b` bytes doing `kind`, across hosts or not, with `crowd`
    /// transfers sharing the network link it takes (its channels
    /// included): the hop's latency, and the time its receiver is busy or
    /// its bytes are on the wire, whichever is longer. `busy` says how
    /// many channels share the receiver's thread at once.
    fn hop(&self, kind: Kind, b: f64, inter: bool, crowd: f64, busy: f64) -> Stage {
        let m = self.m;
        // a piece moves slot by slot: the next hop starts after the first
        let slots = (b / self.slot).ceil().max(1.0);
        if inter {
            let wire = b * crowd / self.bw;
            let own = self.work(kind, b) * busy;
            let each = own.max(wire);
            Stage { latency: m.inter.latency + self.wake, each, first: each / slots }
        } else {
            let own = (self.work(kind, b) + self.pull(b)) * busy;
            let first = (own - self.pull(b) * busy) / slots + self.pull(b.min(self.slot)) * busy;
            Stage { latency: m.intra.latency + self.wake, each: own, first }
        }
    }

    /// Bytes per piece of `count` elements cut in pieces of `chunk`.
    fn pieces(&self, bytes: f64, chunk: usize) -> (f64, f64) {
        let piece = (chunk.max(1) as f64 * self.elem).max(self.elem);
        let q = (bytes / piece).ceil().max(1.0);
        (q, bytes / q)
    }
}

/// A stage of a pipeline: what a piece waits before it starts there, how
/// long the stage is busy with it, and how long with its first slot (after
/// which the next stage can start on it).
#[derive(Clone, Copy, Debug)]
struct Stage {
    latency: f64,
    each: f64,
    first: f64,
}

impl Stage {
    fn slower(self, o: Stage) -> Stage {
        Stage { latency: self.latency.max(o.latency), each: self.each.max(o.each), first: self.first.max(o.first) }
    }

    /// How long a piece takes to reach the next stage.
    fn hop(self) -> f64 {
        self.latency + self.first
    }
}

/// `q` pieces through `d` dependent stages like `s`.
fn pipeline(s: Stage, d: f64, q: f64) -> f64 {
    d * s.hop() + q.max(1.0) * s.each
}

/// `steps` consecutive steps of a ring, each on what its predecessor sent
/// in the step before: every rank busy, or waiting on the hop.
fn ring_steps(s: Stage, steps: f64) -> f64 {
    steps * s.each.max(s.hop())
}

fn log2_ceil(n: usize) -> f64 {
    (n.max(1) as f64).log2().ceil()
}

/// Ranks the model covers (beyond, its sums of per-step terms lose the
/// precision to tell algorithms apart).
pub const MAX_RANKS: usize = 1 << 20;

/// The predicted seconds of `call` run by `algo` on `hosts` under `model`;
/// `Err` for an algorithm that does not implement the collective, a rank
/// count out of range, or a model whose parameters make no sense
/// ([`Model::check`]).
pub fn estimate(call: &Call, algo: Algo, hosts: &Hosts, model: &Model) -> Result<f64, String> {
    let direct = algo == Algo::Direct && call.coll.on_shared(call.in_place);
    if !(call.coll.algos().contains(&algo) || direct) {
        return Err(format!("{algo} does not implement {}", call.coll));
    }
    let n = hosts.nranks();
    if n == 0 || n > MAX_RANKS {
        return Err(format!("{n} ranks: the model covers 1 ..= {MAX_RANKS}"));
    }
    model.check()?;
    let Some(bucket) = model.bucket else {
        return Ok(model.call + closed(call, algo, &Rates::new(call, hosts, model, model.inter.bandwidth)));
    };
    // a token bucket, as the simulator prices it: no faster than at its
    // peak, than the busiest link's bytes at its rate, or than the time at
    // its rate less what the bucket holds
    let rate = model.inter.bandwidth;
    let fast = closed(call, algo, &Rates::new(call, hosts, model, bucket.peak));
    let slow = closed(call, algo, &Rates::new(call, hosts, model, rate));
    let busiest = link_bytes(call, algo, &Rates::new(call, hosts, model, rate));
    Ok(model.call + fast.max(busiest / rate).max(slow - bucket.burst / rate))
}

/// Bytes the busiest network link carries one way.
fn link_bytes(call: &Call, algo: Algo, r: &Rates) -> f64 {
    if r.hosts < 2 {
        return 0.0;
    }
    let (n, h, p) = (r.n as f64, r.hosts as f64, r.per_host as f64);
    let s = (call.count * call.elem) as f64;
    let nics = (r.m.nics.max(1) as f64).min(p);
    // a host's head in a tree over hosts: two child hosts (one where there
    // are two hosts) and a parent (none where the root is the other host)
    let (kids, parent) = if r.hosts > 2 { (2.0, 1.0) } else { (1.0, 0.0) };
    match (call.coll, algo) {
        (Coll::AllReduce, Algo::Ring) => 2.0 * (n - 1.0) / n * s,
        (Coll::AllReduce, Algo::RingRing) => 2.0 * (h - 1.0) / h * s / nics,
        (Coll::AllReduce, Algo::TreeRing) => 2.0 * (h - 1.0) / h * s,
        (Coll::AllReduce, Algo::Tree) => {
            // half the data on each tree, a host's head inner in one (its
            // children's halves in and its parent's, or out the other way)
            // and a leaf in the other, on the same link where the heads'
            // local ranks share one
            let shared = if (r.per_host - 1).is_multiple_of(r.m.nics.max(1)) { 1.0 } else { 0.0 };
            (kids + parent + shared) * s / 2.0
        }
        (Coll::Broadcast | Coll::Reduce, Algo::Tree) => kids * s,
        (Coll::Broadcast | Coll::Reduce, _) => s,
        // halving sends half the vector at its first level, a quarter at
        // its second, ...: the levels across hosts first; doubling the same back
        (Coll::AllReduce, Algo::HalvingDoubling) => {
            2.0 * s * (1.0 - 0.5f64.powf(log2_ceil(r.hosts).min((n as usize).ilog2() as f64))) * p / nics
        }
        (Coll::AllReduce, _) => s * log2_ceil(r.hosts) * p / nics,
        (Coll::AllGather | Coll::ReduceScatter, _) => (n - 1.0) * s,
        (Coll::AllToAll, _) => (n - p) * s * p / nics,
        _ => 0.0,
    }
}

/// The time of the call after the per-call work.
fn closed(call: &Call, algo: Algo, r: &Rates) -> f64 {
    let (n, h, p) = (r.n, r.hosts, r.per_host);
    let c = r.channels;
    let elem = r.elem;
    let count = call.count as f64;
    let s = count * elem;
    let multi = h > 1;
    let nics = r.m.nics.max(1) as f64;
    // per channel
    let s_ch = s / c;
    match (call.coll, algo) {
        (_, _) if n == 1 => {
            // a copy into the output at most
            if call.in_place || matches!(call.coll, Coll::Barrier) {
                r.m.step
            } else {
                r.work(Kind::Copy, s)
            }
        }
        (Coll::AllReduce, Algo::Ring) => ring_all_reduce(r, (n, h), s_ch, call.chunk, c, 1.0),
        (Coll::AllReduce, Algo::RingRing) if !multi => ring_all_reduce(r, (n, 1), s_ch, call.chunk, c, 1.0),
        (Coll::ReduceScatter, Algo::Ring) | (Coll::AllGather, Algo::Ring) => {
            let kind = if call.coll == Coll::AllGather { Kind::CopySend } else { Kind::ReduceSend };
            // per channel, rounds of n pieces; each step moves one piece
            let (rounds, b) = r.pieces(count * elem / c, call.chunk);
            let stage = ring_stage(r, kind, b, (n, h), c, 1.0);
            // a round starts by copying our piece into a slot (and, for an
            // all-gather out of place, into the output); an all-gather's
            // last step copies out without passing on
            let copy = r.work(Kind::Copy, b);
            let ends = match call.coll {
                Coll::AllGather => {
                    let placed = if call.in_place { 0.0 } else { copy };
                    copy + placed - (r.work(Kind::CopySend, b) - copy)
                }
                _ => copy,
            };
            ring_steps(stage, rounds * (n - 1) as f64) + rounds * ends * c
        }
        (Coll::Broadcast | Coll::Reduce, Algo::Ring) => {
            let kind = if call.coll == Coll::Broadcast { Kind::CopySend } else { Kind::ReduceSend };
            let (q, b) = r.pieces(s_ch, call.chunk);
            let stage = ring_stage(r, kind, b, (n, h), c, 1.0);
            // a broadcast's root copies each piece into its output (out of
            // place) and into a slot for the next rank
            let root = if call.coll == Coll::Broadcast { root_copies(call, r, b, 1.0) * c } else { 0.0 };
            pipeline(Stage { each: stage.each.max(root), ..stage }, (n - 1) as f64, q)
        }
        (Coll::AllReduce | Coll::Broadcast | Coll::Reduce, Algo::Tree) => tree(call, r, s_ch, c),
        (Coll::AllReduce, Algo::RecursiveDoubling) => {
            let (q, b) = r.pieces(s_ch, call.chunk);
            let fold = if n.is_power_of_two() { 0.0 } else { 2.0 };
            let (inner, outer) = doubling_levels(n, p, multi);
            let st = |inter: bool, crowd: f64| r.hop(Kind::Exchange, b, inter, crowd, c);
            let intra = st(false, 1.0);
            let across = st(true, c * (p as f64 / nics).max(1.0));
            // every level exchanges the whole vector, a piece at a time; a
            // piece across hosts waits on the network's latency, as in
            // `halving_doubling`
            let per_piece = (inner + fold) * intra.each + outer * across.each;
            (inner + fold) * intra.latency + q * outer * across.latency + q * per_piece
        }
        (Coll::AllReduce, Algo::HalvingDoubling)
        | (Coll::ReduceScatter | Coll::AllGather, Algo::RecursiveDoubling | Algo::HalvingDoubling) => {
            halving_doubling(call.coll, r, s_ch, call.chunk, multi, c)
        }
        (Coll::AllReduce, Algo::RingRing) => {
            // reduce-scatter inside, a ring all-reduce across on a shard, all-gather inside
            let (rounds, b) = r.pieces(s_ch / p as f64, call.chunk.max(1));
            let inside = |kind| ring_steps(ring_stage(r, kind, b, (p, 1), c, 1.0), rounds * (p - 1) as f64);
            let crowd = (p as f64 / nics).max(1.0);
            let across = ring_all_reduce(r, (h, h), s_ch / p as f64, call.chunk, c, crowd);
            inside(Kind::ReduceSend) + across + inside(Kind::CopySend)
        }
        (Coll::AllReduce, Algo::TreeRing) => {
            // up a binary tree inside each host (a node takes its two
            // children's pieces in turn, or sends to both), a ring across
            // the heads, down again
            let (q, b) = r.pieces(s_ch, call.chunk);
            let depth = log2_ceil(p + 1) - 1.0;
            let kids = if p <= 2 { 1.0 } else { 2.0 };
            let leg = |kind| {
                let st = r.hop(kind, b, false, 1.0, c);
                pipeline(Stage { each: kids * st.each, ..st }, depth, q)
            };
            let across = if multi { ring_all_reduce(r, (h, h), s_ch, call.chunk, c, 1.0) } else { 0.0 };
            leg(Kind::ReduceSend) + across + leg(Kind::CopySend)
        }
        (Coll::AllToAll, _) => {
            // every peer's block out and in, all at once
            let inter_peers = (n - p) as f64;
            let intra = (p - 1) as f64 * (r.work(Kind::Copy, s) * 2.0 + r.pull(s) + r.m.intra.latency);
            let wire = inter_peers * s * (p as f64 / nics).max(1.0) / r.bw;
            let own = inter_peers * r.work(Kind::Copy, s) * 2.0;
            intra + own.max(wire) + if multi { r.m.inter.latency } else { 0.0 }
        }
        (Coll::Barrier, _) => {
            let levels = log2_ceil(n);
            let lat = if multi { r.m.inter.latency } else { r.m.intra.latency };
            levels * (lat + r.m.step * r.slow + r.wake)
        }
        (Coll::Send | Coll::Recv, _) => {
            let inter = multi;
            let st = r.hop(Kind::Copy, s, inter, 1.0, 1.0);
            st.latency + st.each + r.work(Kind::Copy, s)
        }
        // a direct call on shared buffers: every rank reduces or copies its
        // share of every rank's data, fetched from the other cores
        (_, _) => {
            let bytes = match call.coll {
                Coll::AllGather => s * (n - 1) as f64,
                _ => s,
            };
            let each = r.work(Kind::Exchange, bytes) + r.pull(bytes * (n - 1) as f64 / n as f64);
            2.0 * r.m.intra.latency + each
        }
    }
}

/// The stage a ring moves at: as busy as its slowest hop, across hosts
/// where it crosses them (one rank per host sends across, its channels
/// sharing the link), and as long to reach the next rank as its hops on
/// average (`hosts` of its `n` hops cross).
fn ring_stage(r: &Rates, kind: Kind, b: f64, (n, hosts): (usize, usize), c: f64, crowd: f64) -> Stage {
    let intra = r.hop(kind, b, false, 1.0, c);
    if hosts < 2 {
        return intra;
    }
    let across = r.hop(kind, b, true, c * crowd, c);
    let f = hosts as f64 / n as f64;
    let mix = |a: f64, b: f64| a * (1.0 - f) + b * f;
    Stage {
        latency: mix(intra.latency, across.latency),
        each: intra.each.max(across.each),
        first: mix(intra.first, across.first),
    }
}

/// A ring all-reduce of `s_ch` bytes per channel over `n` ranks on
/// `hosts` hosts, in rounds of `n` pieces: reduce-scatter then all-gather
/// steps; `crowd` rings of a host share its links.
fn ring_all_reduce(r: &Rates, (n, hosts): (usize, usize), s_ch: f64, chunk: usize, c: f64, crowd: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let (rounds, b) = r.pieces(s_ch / n as f64, chunk);
    let stage = |kind| ring_stage(r, kind, b, (n, hosts), c, crowd);
    let steps = rounds * (n - 1) as f64;
    // each round starts with a piece copied into a slot (its last step,
    // a piece copied out, is the all-gather's: the reduce-scatter's last
    // step copies out only what it has just reduced, from the cache)
    let ends = rounds * r.work(Kind::Copy, b) * c;
    ring_steps(stage(Kind::ReduceSend), steps) + ring_steps(stage(Kind::CopySend), steps) + ends
}

/// Levels of recursive doubling among ranks of one host, and across hosts.
fn doubling_levels(n: usize, per_host: usize, multi: bool) -> (f64, f64) {
    let all = (n.max(1) as f64).log2().floor();
    let inner = if multi { (per_host.max(1) as f64).log2().floor().min(all) } else { all };
    (inner, all - inner)
}

/// Recursive halving (reduce-scatter), doubling (all-gather), or both
/// (all-reduce): at level `k` a rank exchanges `s / 2^k` bytes.
fn halving_doubling(coll: Coll, r: &Rates, s_ch: f64, chunk: usize, multi: bool, c: f64) -> f64 {
    let n = r.n;
    let p = r.per_host;
    let nics = r.m.nics.max(1) as f64;
    let (inner, outer) = doubling_levels(n, p, multi);
    let levels = (inner + outer) as usize;
    let fold = if n.is_power_of_two() { 0.0 } else { 2.0 };
    // the whole vector (all-gather and reduce-scatter count per rank)
    let whole = match coll {
        Coll::AllReduce => s_ch,
        _ => s_ch * n as f64,
    };
    let mut t = 0.0;
    let phase = |kind: Kind| {
        let mut t = 0.0;
        for k in 1..=levels {
            // the outer levels come first when halving: sizes halve from the whole
            let b = whole / (1u64 << k) as f64;
            let inter = (k as f64) <= outer;
            let crowd = if inter { c * (p as f64 / nics).max(1.0) } else { 1.0 };
            let (q, piece) = r.pieces(b, chunk);
            let st = r.hop(kind, piece, inter, crowd, c);
            // an exchange sends a piece and takes its peer's before it sends
            // the next (one piece in flight each way): across hosts each
            // pays the network's latency (inside one, a piece's slots reach
            // the peer as they are written, and its latency mostly hides)
            let waits = if inter { q } else { 1.0 };
            t += waits * st.latency + q * st.each;
        }
        t
    };
    if matches!(coll, Coll::AllReduce | Coll::ReduceScatter) {
        t += phase(Kind::Exchange);
    }
    if matches!(coll, Coll::AllReduce | Coll::AllGather) {
        t += phase(Kind::ExchangeCopy);
    }
    let fold_stage = r.hop(Kind::Exchange, whole, false, 1.0, c);
    // an all-gather first copies its own block into the output, a
    // reduce-scatter last copies its reduced block there
    let own = if coll == Coll::AllReduce { 0.0 } else { r.work(Kind::Copy, s_ch) * c };
    t + fold * (fold_stage.latency + fold_stage.each) + own
}

/// The double binary tree (two channels, half the data on each tree) for
/// all-reduce; one tree for broadcast and reduce. Across hosts, a tree over
/// hosts with a chain inside each.
fn tree(call: &Call, r: &Rates, s_ch: f64, c: f64) -> f64 {
    let (coll, chunk) = (call.coll, call.chunk);
    let (n, h, p) = (r.n, r.hosts, r.per_host);
    let (depth_intra, depth_inter) = if h > 1 { ((p - 1) as f64, log2_ceil(h)) } else { (log2_ceil(n + 1) - 1.0, 0.0) };
    let trees = if coll == Coll::AllReduce { 2.0 } else { 1.0 };
    let (q, b) = r.pieces(s_ch / trees, chunk);
    // per piece an inner node takes one from each of two children (up) or
    // sends to both (down); in the other tree (all-reduce) it is a leaf,
    // which sends one piece up and takes one down, on the same thread
    let leaf = |kind| if trees > 1.0 { r.work(kind, b) * c } else { 0.0 };
    let children = if n <= 2 { 1.0 } else { 2.0 };
    let node = |kind, other| {
        let intra = r.hop(kind, b, false, 1.0, c);
        let across = r.hop(kind, b, true, c, c);
        let widen = |s: Stage| Stage { each: children * s.each + leaf(other), ..s };
        (widen(intra), widen(across))
    };
    // a host's head takes two child hosts' pieces up and its parent's down
    // through its link, the heads of both trees on the same one (more than
    // the bytes, `link_bytes`: the simulator holds a link for a message
    // from its first slot to its last, which a head's children send as
    // their own children's come in)
    let wire = |ways: f64| if h > 1 { ways * b * trees * c / r.bw } else { 0.0 };
    let leg = |kind, other, ways| {
        let (inside, across) = node(kind, other);
        let slowest = if h > 1 { inside.slower(across) } else { inside };
        (depth_intra * inside.hop() + depth_inter * across.hop(), slowest.each.max(wire(ways)))
    };
    let (up, up_each) = leg(Kind::ReduceSend, Kind::Copy, 2.0);
    let (down, down_each) = leg(Kind::CopySend, Kind::Copy, 2.0);
    let more = q.max(1.0);
    // every rank inner in one tree and a leaf in the other, both at once;
    // on two ranks each is the root of one, which sends what it has just
    // reduced straight back down from the cache, copying nothing more
    let root_copy = if coll == Coll::AllReduce && n <= 2 { r.work(Kind::Copy, b) - r.m.step * r.slow } else { 0.0 };
    let both = up_each + down_each - root_copy * c;
    match coll {
        // up and down at once: every piece passes both ways through a node
        Coll::AllReduce => up + down + more * both.max(wire(3.0)),
        Coll::Reduce => up + more * up_each,
        _ => {
            // the root copies each piece into its output (out of place) and
            // sends it to each child: one on a host (the tree hangs below
            // it), its host's next rank and child hosts across hosts
            let kids = if h > 1 { 1.0 + if h > 2 { 2.0 } else { 1.0 } } else { 1.0 };
            down + more * down_each.max(root_copies(call, r, b, kids) * c)
        }
    }
}

/// A broadcast root's work on a piece of `b` bytes: its copy into the
/// output (out of place; in place there is nothing to copy) and one
/// into a slot for each of `sends` peers.
fn root_copies(call: &Call, r: &Rates, b: f64, sends: f64) -> f64 {
    let placed = if call.in_place { 0.0 } else { 1.0 };
    (placed + sends) * r.work(Kind::Copy, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{simulate, Link};

    fn h100() -> Model {
        Model::H100
    }

    /// A call cut as the tuner cuts it on hosts of 8 (32 KiB slots,
    /// pieces of 16), with at most 256 pieces.
    fn call(coll: Coll, bytes: usize) -> Call {
        let count = (bytes / 4).max(1);
        let chunk = (16 * 8192).max(count / 256);
        Call { coll, count, elem: 4, root: 0, channels: 1, chunk, slot: 8192, in_place: false }
    }

    /// The algorithm `time` puts first, ties broken as the tuner breaks them.
    fn fastest(call: &Call, time: impl Fn(Algo) -> Option<f64>) -> Algo {
        let mut t: Vec<(Algo, f64)> = call.coll.algos().iter().filter_map(|&a| time(a).map(|s| (a, s))).collect();
        crate::tune::pick_first(call.coll.algos(), &mut t);
        t[0].0
    }

    /// Every all-reduce algorithm on `hosts`, 8 B - 1 GiB by 8x, closed
    /// form against simulator: the times beyond 10 % of each other (ring's
    /// among them), and the sizes where the two pick differently.
    fn against_the_simulator(hosts: &Hosts, name_terms: bool) -> (Vec<String>, Vec<String>) {
        let m = h100();
        let (mut misses, mut picks) = (Vec::new(), Vec::new());
        for bytes in (0..10).map(|k| 8usize << (3 * k)) {
            let c = call(Coll::AllReduce, bytes);
            for &a in Coll::AllReduce.algos() {
                let r = ratio(&c, a, hosts, &m);
                if !(0.9..=1.1).contains(&r) {
                    let terms = match name_terms.then(|| blame(&c, a, hosts, &m).join(", ")) {
                        None => String::new(),
                        Some(t) if t.is_empty() => "; no one term".into(),
                        Some(t) => format!("; within 10 % without: {t}"),
                    };
                    misses.push(format!("{a} at {bytes} B: closed / simulated {r:.2}{terms}"));
                }
            }
            let by_closed = fastest(&c, |a| estimate(&c, a, hosts, &m).ok());
            let by_sim = fastest(&c, |a| simulate(&c, a, hosts, &m).ok().map(|p| p.seconds));
            if by_closed != by_sim {
                picks.push(format!("{bytes} B: {by_closed} by the closed form, {by_sim} by the simulator"));
            }
        }
        eprintln!("misses beyond 10 %:\n{}\npicks that differ:\n{}", misses.join("\n"), picks.join("\n"));
        (misses, picks)
    }

    /// The closed form's time over the simulator's.
    fn ratio(c: &Call, a: Algo, hosts: &Hosts, m: &Model) -> f64 {
        let (closed, sim) = (estimate(c, a, hosts, m), simulate(c, a, hosts, m).map(|p| p.seconds));
        closed.expect("estimates") / sim.expect("simulates")
    }

    /// The terms of the model that, taken away from both (a time set to
    /// nothing, a rate so fast it costs nothing), bring the closed form
    /// within 10 % of the simulator: where the two disagree, the terms
    /// they price differently.
    fn blame(c: &Call, a: Algo, hosts: &Hosts, m: &Model) -> Vec<&'static str> {
        let free = 1e18;
        let without = [
            ("latency inside a host", Model { intra: Link { latency: 0.0, ..m.intra }, ..*m }),
            ("network latency", Model { inter: Link { latency: 0.0, ..m.inter }, ..*m }),
            ("fetching from other cores", Model { intra: Link { bandwidth: free, ..m.intra }, first_slot: 0.0, ..*m }),
            ("network bytes", Model { inter: Link { bandwidth: free, ..m.inter }, bucket: None, ..*m }),
            ("copies", Model { copy: free, ..*m }),
            ("reductions", Model { reduce: free, ..*m }),
            ("per-step work", Model { step: 0.0, ..*m }),
            ("the cache", Model { cache: 0.0, ..*m }),
            ("waking on shared cores", Model { switch: 0.0, ..*m }),
        ];
        without.into_iter().filter(|(_, w)| (0.9..=1.1).contains(&ratio(c, a, hosts, w))).map(|(t, _)| t).collect()
    }

    #[test]
    fn on_8_hosts_of_8_it_follows_the_simulator() {
        // the ring within 10 % at every size, and the same pick at every
        // size but at most one; each miss named with the terms without
        // which the two agree
        let (misses, picks) = against_the_simulator(&Hosts::blocks(&[8; 8]), true);
        assert!(!misses.iter().any(|m| m.starts_with("ring ")), "{misses:?}");
        assert!(picks.len() <= 1, "{picks:?}");
    }

    #[test]
    fn at_4096_ranks_it_picks_what_the_simulator_picks() {
        // against the simulator folded onto the first host's ranks (rings,
        // ring-ring, tree-ring, doubling) and along the line of its pieces
        // (the tree): the same pick at every size but at most one
        let (_, picks) = against_the_simulator(&Hosts::blocks(&[8; 512]), false);
        assert!(picks.len() <= 1, "{picks:?}");
    }

    #[test]
    fn at_4096_ranks_every_algorithm_is_priced_and_the_picks_follow_the_sizes() {
        let (m, hosts) = (h100(), Hosts::blocks(&[8; 512]));
        for bytes in [8, 1 << 30] {
            let c = call(Coll::AllReduce, bytes);
            for &a in Coll::AllReduce.algos() {
                let t = estimate(&c, a, &hosts, &m).expect("estimates");
                assert!(t.is_finite() && t > 0.0, "{a} at {bytes} B: {t}");
            }
        }
        // few steps for a small call, a host's links all busy for a large one
        let pick = |bytes| {
            let c = call(Coll::AllReduce, bytes);
            fastest(&c, |a| estimate(&c, a, &hosts, &m).ok())
        };
        assert!(matches!(pick(8), Algo::RecursiveDoubling | Algo::Tree), "{:?}", pick(8));
        assert_eq!(pick(1 << 30), Algo::RingRing);
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        let hosts = Hosts::blocks(&[8; 8]);
        let c = call(Coll::Broadcast, 1 << 20);
        let e = estimate(&c, Algo::RecursiveDoubling, &hosts, &h100()).expect_err("rd has no broadcast");
        assert!(e.contains("does not implement broadcast"), "{e}");
        let zero = Model { inter: Link { latency: 6e-6, bandwidth: 0.0 }, ..h100() };
        let e = estimate(&c, Algo::Ring, &hosts, &zero).expect_err("no bandwidth");
        assert!(e.contains("[inter] bandwidth_gb_s = 0: must be above 0"), "{e}");
        let negative = Model { step: -1e-6, ..h100() };
        let e = estimate(&c, Algo::Ring, &hosts, &negative).expect_err("negative step");
        assert!(e.contains("[rank] step_us"), "{e}");
        let e = estimate(&c, Algo::Ring, &Hosts::flat(MAX_RANKS + 1), &h100()).expect_err("too many ranks");
        assert!(e.contains("ranks: the model covers"), "{e}");
    }
}
