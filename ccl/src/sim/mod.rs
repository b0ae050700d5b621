//! The simulator: how long a schedule takes on a modelled topology.
//!
//! The same schedules the executor runs and the verifier proves are timed
//! here, step by step, for every rank at once. The model is α-β per link:
//! a message costs a latency plus its bytes over a bandwidth. Ranks of one
//! host talk through shared memory (each connection on its own; the bytes
//! over the bandwidth are the receiver's busy time, fetching them out of
//! the other core, which its other channels cannot use; a message's first
//! slot comes slower, before the prefetcher runs ahead; and a slot that
//! waits for a receiver without a core, while the call streams more than
//! the cache holds, comes from memory at the speed of a copy); between
//! hosts, every host has `nics` network links (a rank uses link `local
//! rank % nics`, as NCCL pairs GPUs with NICs), each direction of which
//! carries one message at a time, so concurrent transfers share it. Every
//! rank has one progress thread: its local work (copying into and out of
//! slots, reducing) is serial across its channels, which it serves in the
//! order they became ready. Ranks of a host with more ranks than cores run
//! slower for sharing them: where they split evenly over the cores, each
//! by its core's work over its own, over a call of many pieces (a rank
//! with less to do leaves the core to the others), else by ranks / cores.
//! They get a core back to take a message; one wake-up takes what came
//! for all their channels meanwhile. Ranks that are GPUs (`streams`) run
//! each channel on a stream of its own, as ccl's GPU engine does: their
//! channels work at once, and within a host a GPU's own link (each
//! direction, like a network link) moves the bytes while its kernels
//! reduce them. A link is busy for a message's bytes; a message that comes
//! slower than that (sent as it is reduced) shares it with the next. A step's message moves slot by slot,
//! as the executor moves it: the receiver starts on the first slot and
//! forwards it while the next arrives, and ends one slot's work after the
//! last. Slots are taken as plentiful (the verifier has already shown the
//! schedules cannot deadlock on them).
//!
//! Where a symmetry of the hosts maps every rank's schedule onto
//! another's (a ring's ranks differ only by rotation), one rank of each
//! class is timed for all (`fold`); a call of many pieces is timed at two
//! shorter counts and extended along the line through them. So a flat
//! ring over 4096 ranks is timed as 8 ranks, and a tree of a thousand
//! pieces as two of tens.
//!
//! The tuner picks the algorithm with the least predicted time by the
//! closed form; `ccl-sim` prints the predictions for a described cluster,
//! and where the two models disagree, the terms they price differently
//! (`apart`).

#[cfg(any(test, feature = "internals"))]
mod apart;
mod closed;
mod fold;
mod run;

#[cfg(any(test, feature = "internals"))]
pub use apart::{closed_over_simulated, terms_apart};
pub use closed::estimate;
pub use run::simulate;
#[cfg(feature = "internals")]
pub use run::{Prediction, MAX_STEPS};

use crate::algo::Coll;

/// A call to time: what it moves and how it is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The collective.
    pub coll: Coll,
    /// Elements per rank (as the collective counts them).
    pub count: usize,
    /// Bytes per element.
    pub elem: usize,
    /// The root, for rooted collectives.
    pub root: usize,
    /// Channels.
    pub channels: usize,
    /// Elements per pipeline piece.
    pub chunk: usize,
    /// Elements per slot: the unit in which a step's message moves.
    pub slot: usize,
    /// Whether input and output are one buffer: a step then reduces into
    /// the very memory it reads, and a copy between them is no work.
    pub in_place: bool,
}

/// One kind of link: a per-message latency and a bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Seconds per message, before its first byte arrives.
    pub latency: f64,
    /// Bytes per second.
    pub bandwidth: f64,
}

/// A token bucket shaping each network link, as `tc tbf` does: a link with
/// tokens sends at `peak`; tokens come back at the link's bandwidth, up to
/// `burst` bytes. Over a run of calls the link then carries no more than
/// its bandwidth on average, but the time it stands idle within a call
/// (waiting on latencies and on the ranks' work) it makes up for later at
/// `peak`, as far as the bucket holds that idle time's tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// Bytes per second while the bucket has tokens.
    pub peak: f64,
    /// Bytes of tokens the bucket holds.
    pub burst: f64,
}

/// The parameters of a topology, identical on every rank of a job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    /// Between ranks of one host (shared memory; the bandwidth is the
    /// receiver's rate of fetching from the sender's core).
    pub intra: Link,
    /// Bytes per second at which a receiver fetches the first slot of a
    /// message from another core of its host, on top of `intra`: line by
    /// line, before the hardware prefetcher runs ahead (0: not modelled).
    pub first_slot: f64,
    /// How much of a message comes at `first_slot`: its first slot, at most
    /// this many bytes (0: the whole first slot). What the prefetcher needs
    /// to catch up does not grow with the slot.
    pub first_max: usize,
    /// Each of a host's network links (each direction).
    pub inter: Link,
    /// Network links per host.
    pub nics: usize,
    /// A token bucket on each network link (`None`: a plain link).
    pub bucket: Option<Bucket>,
    /// Bytes per second one rank copies (into or out of a slot).
    pub copy: f64,
    /// Bytes per second one rank reduces (two inputs, one output).
    pub reduce: f64,
    /// Seconds of fixed work per step (polling, bookkeeping).
    pub step: f64,
    /// Seconds of fixed work per call, before a rank's first step (finding
    /// the call's plan and schedule, fingerprinting it).
    pub call: f64,
    /// Cores per host (0: as many as ranks).
    pub cores: usize,
    /// Seconds of core time a rank spends, on a host with more ranks than
    /// cores, getting a core back to take a message (scaled by the share of
    /// the host's ranks without one: a hand-off there often costs a context
    /// switch); the rank's other channels wait behind it, and messages that
    /// came for them before it had the core back come with it.
    pub switch: f64,
    /// Bytes of cache per host (0: none modelled).
    pub cache: f64,
    /// How many times faster copies and reductions run when a call's data
    /// on a host (every local rank's input and output) fits that cache.
    pub cached: f64,
    /// The same, on a host with more ranks than cores: less, since a
    /// rank's data leaves its core's own caches while another rank runs
    /// there, and only the shared cache keeps it.
    pub shared_cached: f64,
    /// Whether the ranks are GPUs (`[rank] device = "gpu"`), whose
    /// channels each run on a stream of their own, as ccl's GPU engine
    /// runs them: a channel's work does not wait for the rank's other
    /// channels', and within a host the bytes move over the GPU's own link
    /// (each direction carrying one message at a time, shared by its
    /// channels as a network link is) while the kernels reduce them,
    /// rather than by the receiver's thread. Otherwise one progress thread
    /// serves all of a rank's channels, fetching from other cores itself.
    pub streams: bool,
}

impl Model {
    /// Figures for a current server over TCP on 10 Gbit/s Ethernet; the
    /// shared-memory hand-off, copies, reductions, per-step work and
    /// context switches are fitted with `bench/simcheck` to 2- and 4-rank
    /// runs at 8 B–16 MiB on this project's 2-core machine, as
    /// `ccl/topologies/this-machine-shm.toml`; what the tuner assumes until
    /// measured.
    pub const DEFAULT: Model = Model {
        intra: Link { latency: 0.14e-6, bandwidth: 80e9 },
        first_slot: 60e9,
        first_max: 16 << 10,
        inter: Link { latency: 30e-6, bandwidth: 1.1e9 },
        nics: 1,
        bucket: None,
        copy: 18e9,
        reduce: 13e9,
        step: 0.03e-6,
        call: 0.04e-6,
        cores: 0,
        switch: 7e-6,
        cache: 24.0 * (1 << 20) as f64,
        cached: 3.0,
        shared_cached: 1.9,
        streams: false,
    };

    /// The shipped 8 x 8 H100 topology (`ccl/topologies/h100-8x8-ib.toml`),
    /// for the closed form's tests and the tuner's benchmark.
    #[doc(hidden)]
    #[cfg(any(test, feature = "internals"))]
    pub const H100: Model = Model {
        intra: Link { latency: 3e-6, bandwidth: 360e9 },
        first_slot: 0.0,
        first_max: 0,
        inter: Link { latency: 6e-6, bandwidth: 50e9 },
        nics: 8,
        bucket: None,
        copy: 2500e9,
        reduce: 1250e9,
        step: 1e-6,
        call: 0.0,
        cores: 0,
        switch: 0.0,
        cache: 0.0,
        cached: 1.0,
        shared_cached: 1.0,
        streams: true,
    };

    /// `Err` naming the topology key of a parameter that would make a term
    /// of either model meaningless: a rate that is not above 0, a latency
    /// or time below 0, or any that is not finite.
    pub fn check(&self) -> Result<(), String> {
        let rates = [
            ("[intra] bandwidth_gb_s", self.intra.bandwidth),
            ("[inter] bandwidth_gb_s", self.inter.bandwidth),
            ("[rank] copy_gb_s", self.copy),
            ("[rank] reduce_gb_s", self.reduce),
        ];
        let times = [
            ("[intra] latency_us", self.intra.latency),
            ("[inter] latency_us", self.inter.latency),
            ("[rank] step_us", self.step),
            ("[rank] call_us", self.call),
            ("[rank] switch_us", self.switch),
            ("[intra] first_slot_gb_s", self.first_slot),
            ("[rank] cache_mib", self.cache),
        ];
        let speedups = [("[rank] cached_speedup", self.cached), ("[rank] shared_cached_speedup", self.shared_cached)];
        for (key, v) in rates.into_iter().chain(speedups) {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{key} = {v}: must be above 0"));
            }
        }
        for (key, v) in times {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{key} = {v}: must be 0 or more"));
            }
        }
        if let Some(b) = self.bucket {
            if !(b.peak.is_finite() && b.peak > 0.0 && b.burst.is_finite() && b.burst >= 0.0) {
                return Err(format!("[inter] token bucket (peak {}, burst {}): must be above 0", b.peak, b.burst));
            }
        }
        Ok(())
    }

    /// How a rank runs on a host of `ranks` ranks, each with `bytes` of
    /// input and as much output: what the simulator applies to every
    /// rank's steps and the closed form to a call's.
    pub(crate) fn on_host(&self, ranks: usize, bytes: f64) -> OnHost {
        let share = if self.cores > 0 { ranks as f64 / self.cores as f64 } else { 1.0 };
        // every local rank's input and output
        let spills = self.cache > 0.0 && 2.0 * ranks as f64 * bytes > self.cache;
        // ranks time-sharing cores evict each other's data from the cores'
        // own caches: only the shared cache's speed-up
        let fits = self.cache > 0.0 && !spills;
        let gain = if share > 1.0 { self.shared_cached } else { self.cached };
        let speed = if fits { gain.max(f64::MIN_POSITIVE) } else { 1.0 };
        OnHost {
            slow: share.max(1.0) / speed,
            call: self.call * share.max(1.0),
            // a fused step's second pass always finds its data in the cache
            hot: if self.cache > 0.0 { speed / self.cached.max(speed) } else { 1.0 },
            wake: if share > 1.0 { self.switch * (1.0 - 1.0 / share) } else { 0.0 },
            // a slot waiting for its receiver to get a core, while the call
            // streams more data than the cache holds, is evicted meanwhile:
            // the receiver fetches it from memory, at the speed of a copy
            fetch: if share > 1.0 && spills { self.intra.bandwidth.min(self.copy) } else { self.intra.bandwidth },
        }
    }

    /// This model with `cores` cores per host.
    pub fn with_cores(self, cores: usize) -> Model {
        Model { cores, ..self }
    }

    /// This model with the network link replaced.
    pub fn with_inter(self, inter: Link) -> Model {
        Model { inter, ..self }
    }
}

/// How a rank runs on its host ([`Model::on_host`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OnHost {
    /// How much slower its work runs for sharing cores, or faster for
    /// data that stays in the cache.
    pub slow: f64,
    /// Seconds of its per-call work.
    pub call: f64,
    /// The share of a copy's time a copy out of the cache takes.
    pub hot: f64,
    /// Core time to get a core back for a message.
    pub wake: f64,
    /// Bytes per second it fetches from another core of its host.
    pub fetch: f64,
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} us, {:.2} GB/s", self.latency * 1e6, self.bandwidth / 1e9)
    }
}
