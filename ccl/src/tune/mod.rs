//! Choosing the algorithm, channels and piece size of a call.
//!
//! Channels: on one host of CPUs a call runs on one (each channel there is
//! the same ring, and more of them only share the same cores); across
//! hosts, or on GPUs (each channel on a stream of its own), the model
//! prices 1, 2, 4, 8 and 16 channels, each channel's ring
//! crossing between hosts at other ranks and so through other NICs
//! ([`Hosts::channel_ring`]), and a call takes more channels only where
//! they are predicted at least [`CHANNEL_GAIN`] faster than fewer.
//!
//! The cost model decides: for the first call of each collective, element
//! size and size class (a power of two of bytes), every algorithm that
//! implements the collective is priced by the closed-form model
//! ([`crate::sim::estimate`], microseconds at any rank count, held to the
//! simulator's times and picks by tests) on this communicator's hosts,
//! under the job's model (its network link measured at start-up when
//! there are several hosts), and the fastest is kept for every later call
//! of that class, in place or not. It times the calls out of place: in
//! place, where a rank's reductions and copies find what it has just sent
//! still in its cache, the model puts recursive doubling a little ahead of
//! ring on 2 ranks from 8 MiB, closer than it can tell apart, and measured
//! ring was ahead (`bench/results/tuner-ties.md`). Every rank computes the
//! same choice from the same inputs. Forced choices (`CCL_ALGO`,
//! `CCL_NCHANNELS`, `CCL_CHUNKSIZE`) win where they apply. The piece size
//! never exceeds half a connection's slots, the condition under which the
//! verifier proves every schedule deadlock-free. A tuning file
//! (`CCL_TUNE_FILE`, see [`Rules`]) of measured choices is consulted
//! before the model.

mod rules;

pub use rules::Rules;

use crate::algo::{Algo, Coll};
use crate::config::{Config, LogLevel};
use crate::sim::{estimate, simulate, Call, Model};
use crate::topo::Hosts;
use crate::transport::Geometry;
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What a call will run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The algorithm.
    pub algo: Algo,
    /// Channels.
    pub channels: usize,
    /// Elements per pipeline piece.
    pub chunk: usize,
    /// Elements per slot.
    pub slot_elems: usize,
}

/// How the tuner cuts a call of elements of `elem` bytes on connections
/// cut as `ring` (before `CCL_CHUNKSIZE`): elements per slot, and per
/// pipeline piece ([`pieces`]).
pub fn cut(elem: usize, ring: Geometry) -> (usize, usize) {
    pieces(ring.slot_bytes, elem, ring)
}

/// Elements per slot, and per pipeline piece (half a connection's slots),
/// of elements of `elem` bytes in `slot_bytes` of each of `ring`'s slots.
pub fn pieces(slot_bytes: usize, elem: usize, ring: Geometry) -> (usize, usize) {
    let slot_elems = (slot_bytes / elem.max(1)).max(1);
    (slot_elems, slot_elems * ring.nslots / 2)
}

/// Pipeline pieces a call is cut into at most: a smaller `CCL_CHUNKSIZE`
/// is raised to fit (a schedule's steps, and so its set-up, grow with its
/// pieces).
pub const MAX_PIECES: usize = 1024;

/// Pieces per rank at most when pricing a call (by either model, so that
/// the closed form is priced as it is held to the simulator, which takes
/// time per piece); larger calls are priced with proportionally larger
/// pieces.
const SIM_PIECES: usize = 256;

/// A communicator's tuner: its model and the choices made so far.
pub struct Tuner {
    /// Says what it chose (under `CCL_DEBUG=INFO`): rank 0's tuner.
    loud: bool,
    model: Mutex<Model>,
    rules: Mutex<Rules>,
    /// The choices made so far: algorithm and channels.
    memo: Mutex<HashMap<MemoKey, (Algo, usize)>>,
    /// Counts changes of model or rules: a choice remembered elsewhere is
    /// current while this has not moved.
    generation: AtomicU64,
    /// Whether it has warned that `CCL_CHUNKSIZE` was raised.
    raised: std::sync::atomic::AtomicBool,
}

/// What a remembered choice holds for: collective, element size, size
/// class, on shared buffers in place or not.
type MemoKey = (Coll, usize, u32, Option<bool>);

/// The channel counts the model prices for calls across hosts.
pub const AUTO_CHANNELS: [usize; 5] = [1, 2, 4, 8, 16];

/// How much faster (a fraction) the model must predict a call on more
/// channels before it takes them: each channel costs connections, slot
/// memory and steps the model prices only in part.
pub const CHANNEL_GAIN: f64 = 0.1;

/// The channel counts the model prices for a call on `hosts`: one on one
/// host of CPUs, else [`AUTO_CHANNELS`].
fn auto_widths(hosts: &Hosts, model: &Model) -> &'static [usize] {
    if hosts.groups().len() < 2 && !model.streams {
        &[1]
    } else {
        &AUTO_CHANNELS
    }
}

/// The channels the tuner would run `call` on (its `channels` aside),
/// were its algorithm one of `algos`: the fewest within [`CHANNEL_GAIN`]
/// of the fastest, as priced by the closed form; what `ccl-sim` times
/// each algorithm on unless told.
#[cfg(feature = "internals")]
pub fn auto_channels(call: &Call, algos: &[Algo], hosts: &Hosts, model: &Model) -> usize {
    let mut best: Option<(usize, f64)> = None;
    for &channels in auto_widths(hosts, model) {
        let times = predictions_among(&Call { channels, ..*call }, algos, hosts, model, true);
        let Some(&(_, t)) = times.first() else { continue };
        if best.is_none_or(|(_, b)| t < b * (1.0 - CHANNEL_GAIN)) {
            best = Some((channels, t));
        }
    }
    best.map_or(1, |(c, _)| c)
}

/// The size class of `bytes`: the exponent of the next power of two.
pub fn size_class(bytes: usize) -> u32 {
    bytes.max(1).next_power_of_two().trailing_zeros()
}

/// `bytes` in the largest binary unit that divides it exactly.
pub(crate) fn human(bytes: usize) -> String {
    let unit = |shift: u32| bytes >= 1 << shift && bytes.is_multiple_of(1 << shift);
    match bytes {
        b if unit(30) => format!("{} GiB", b >> 30),
        b if unit(20) => format!("{} MiB", b >> 20),
        b if unit(10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

impl Tuner {
    /// A tuner that predicts with `model`; a `loud` one reports its choices
    /// under `CCL_DEBUG=INFO`.
    pub fn new(model: Model, loud: bool) -> Self {
        Tuner {
            loud,
            model: Mutex::new(model),
            rules: Mutex::new(Rules::default()),
            memo: Mutex::new(HashMap::default()),
            generation: AtomicU64::new(0),
            raised: Default::default(),
        }
    }

    /// Moves whenever the model or the rules change (choices may differ).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The model it predicts with.
    pub fn model(&self) -> Model {
        *self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Predicts with `model` from now on (choices made so far are dropped).
    /// Every rank must set the same model.
    pub fn set_model(&self, model: Model) {
        *self.model.lock().unwrap_or_else(|p| p.into_inner()) = model;
        self.memo.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Consults `rules` before the model from now on.
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.lock().unwrap_or_else(|p| p.into_inner()) = rules;
        // choices made before came without these rules
        self.memo.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The choice for `coll` moving `count` elements of `elem_size` bytes.
    /// What a call of `count` elements of `elem_size` bytes runs: `shared`
    /// is `Some(in place)` where its buffers are shared by every rank
    /// (`alloc_shared`) and the call can run on them directly
    /// ([`Coll::on_shared`]), which makes [`Algo::Direct`] a candidate.
    pub fn choose(
        &self,
        coll: Coll,
        count: usize,
        elem_size: usize,
        hosts: &Hosts,
        cfg: &Config,
        shared: Option<bool>,
    ) -> Choice {
        let elem = elem_size.max(1);
        let (slot_elems, max_chunk) = cut(elem, cfg.slots_on(hosts));
        let chunk = match cfg.chunksize {
            0 => max_chunk,
            b => {
                let fewest = count.div_ceil(MAX_PIECES);
                let raised = b / elem < fewest && b / elem < max_chunk;
                if raised && !self.raised.swap(true, Ordering::Relaxed) && self.loud && cfg.debug >= LogLevel::Warn {
                    eprintln!(
                        "ccl WARN CCL_CHUNKSIZE={b} would cut a call of {} into more than {MAX_PIECES} pieces: \
                         using {} pieces for such calls",
                        human(count.saturating_mul(elem)),
                        human(fewest.min(max_chunk) * elem)
                    );
                }
                (b / elem).max(fewest).clamp(1, max_chunk)
            }
        };
        let candidates = candidates(coll, shared);
        let forced = cfg.algo.filter(|a| candidates.contains(a));
        let widths: &[usize] = match cfg.nchannels {
            Some(ref c) => std::slice::from_ref(c),
            None if coll.p2p() || coll == Coll::Barrier => &[1],
            None => auto_widths(hosts, &self.model()),
        };
        let (algo, channels) = match (forced, widths) {
            (Some(a), &[c]) => (a, c),
            (None, &[c]) if candidates.len() == 1 => (candidates[0], c),
            _ => {
                let class = size_class(count.saturating_mul(elem));
                let key = (coll, elem, class, shared);
                let memo = self.memo.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied();
                match memo {
                    // (what is forced stands, whatever was remembered)
                    Some((a, c)) => (forced.unwrap_or(a), if let &[w] = widths { w } else { c }),
                    None => {
                        // a rule from CCL_TUNE_FILE first (measured on
                        // private buffers), else the model; either is remembered
                        let rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
                        let ruled = rules.get(coll, hosts.nranks(), hosts.groups().len(), class);
                        drop(rules);
                        let algos = match (forced, ruled) {
                            (Some(a), _) => vec![a],
                            (None, Some(a)) if shared.is_none() => vec![a],
                            _ => candidates.clone(),
                        };
                        let call =
                            Call { coll, count, elem, root: 0, channels: 1, chunk, slot: slot_elems, in_place: false };
                        let choice = self.predict_best(&call, &algos, widths, hosts, cfg, shared);
                        self.memo.lock().unwrap_or_else(|p| p.into_inner()).insert(key, choice);
                        choice
                    }
                }
            }
        };
        let chunk = if algo == Algo::Direct && shared.is_some() { shared_block(elem) } else { chunk };
        Choice { algo, channels, chunk, slot_elems }
    }

    /// Times `algos` for `call` on each of `widths` channels and returns
    /// the fastest, on the fewest channels within [`CHANNEL_GAIN`] of it;
    /// under `CCL_DEBUG=INFO` says what it chose and why.
    fn predict_best(
        &self,
        call: &Call,
        algos: &[Algo],
        widths: &[usize],
        hosts: &Hosts,
        cfg: &Config,
        shared: Option<bool>,
    ) -> (Algo, usize) {
        let model = self.model();
        let mut best: Option<(usize, Vec<(Algo, f64)>)> = None;
        for &channels in widths {
            let call = Call { channels, ..*call };
            let mut times = match shared {
                None if algos == candidates(call.coll, None) => ranked(&call, hosts, &model),
                None => predictions_among(&call, algos, hosts, &model, true),
                Some(in_place) => ranked_on_shared(&call, in_place, hosts, &model),
            };
            times.retain(|t| algos.contains(&t.0) || shared.is_some());
            let (Some(&(_, t)), Some((_, fewer))) = (times.first(), &best) else {
                best = best.or(Some((channels, times)));
                continue;
            };
            if fewer.first().is_none_or(|f| t < f.1 * (1.0 - CHANNEL_GAIN)) {
                best = Some((channels, times));
            }
        }
        let (channels, times) = best.unwrap_or((1, Vec::new()));
        let &Call { coll, count, elem, chunk, slot, .. } = call;
        let algo = times.first().map_or(algos.first().copied().unwrap_or(coll.algos()[0]), |t| t.0);
        let chunk = if algo == Algo::Direct && shared.is_some() { shared_block(elem) } else { chunk };
        if self.loud && cfg.debug >= LogLevel::Info {
            let bytes = count.saturating_mul(elem);
            let why: Vec<String> = times.iter().map(|(a, t)| format!("{a} {:.1} us", t * 1e6)).collect();
            eprintln!(
                "ccl INFO {coll} {} class (first call {bytes} B) on {} ranks / {} hosts: {algo}, {channels} channel(s), \
                 pieces of {chunk} elements in slots of {slot}; predicted {} (network {})",
                human(1usize << size_class(bytes)),
                hosts.nranks(),
                hosts.groups().len(),
                why.join(", "),
                model.inter,
            );
        }
        (algo, channels)
    }
}

/// Predictions this close to the fastest (a fraction of it) are ties: the
/// model, fitted to within 25 % of measured times, cannot rank them; a tie
/// goes to the algorithm listed first for the collective (ring before the
/// others). On 2 ranks the double tree and ring move the same bytes, and
/// measured, tree was behind where the model put it just ahead; the
/// margin is no wider because just beyond it, measured, the model's pick
/// was the faster (`bench/results/tuner-ties.md`).
pub const TIE: f64 = 0.01;

/// The algorithms a call may run: its collective's, and first
/// [`Algo::Direct`] where it runs on shared buffers (`shared`: in place or
/// not, [`Tuner::choose`]). First, for ties ([`TIE`]): the model counts
/// the same reductions and copies for it as for a ring, but not that it
/// moves each byte between the cores once where a ring moves it through
/// slots at every step, nor that its ranks never wait for one another's
/// slots (`bench/results/shared-buffers.md`).
fn candidates(coll: Coll, shared: Option<bool>) -> Vec<Algo> {
    let mut v = coll.algos().to_vec();
    if shared.is_some_and(|in_place| coll.on_shared(in_place)) && !v.contains(&Algo::Direct) {
        v.insert(0, Algo::Direct);
    }
    v
}

/// Elements of `elem` bytes a rank reduces at a time on shared buffers,
/// before copying them out ([`crate::algo::shared`]): small enough that
/// the copies read them from the L1/L2 cache.
pub fn shared_block(elem: usize) -> usize {
    ((32 << 10) / elem.max(1)).max(1)
}

/// Every algorithm for `call`'s collective, with its predicted seconds
/// under `model`, the tuner's pick first (the fastest, or the first listed
/// of those within [`TIE`] of it), then the others fastest first.
pub fn predictions(call: &Call, hosts: &Hosts, model: &Model) -> Vec<(Algo, f64)> {
    predictions_among(call, &candidates(call.coll, None), hosts, model, true)
}

/// [`predictions`] among `algos` by the simulator at any rank count, as
/// `ccl-sim` prints them ([`Algo::Direct`] on shared buffers).
#[cfg(feature = "internals")]
pub fn simulated(call: &Call, algos: &[Algo], hosts: &Hosts, model: &Model) -> Vec<(Algo, f64)> {
    predictions_among(call, algos, hosts, model, false)
}

/// [`predictions`] among `algos`, as `ccl-sim --closed` prints them: the
/// call cut as the tuner cuts it for either model.
#[cfg(feature = "internals")]
pub fn estimated(call: &Call, algos: &[Algo], hosts: &Hosts, model: &Model) -> Vec<(Algo, f64)> {
    predictions_among(call, algos, hosts, model, true)
}

/// [`predictions`] among `algos`, by the closed form or the simulator;
/// [`Algo::Direct`] on shared buffers.
fn predictions_among(call: &Call, algos: &[Algo], hosts: &Hosts, model: &Model, closed: bool) -> Vec<(Algo, f64)> {
    let mut times: Vec<(Algo, f64)> = algos
        .iter()
        .filter_map(|&a| {
            let c = priced(call, a);
            if closed {
                return estimate(&c, a, hosts, model).ok().map(|t| (a, t));
            }
            simulate(&c, a, hosts, model).ok().map(|p| (a, p.seconds))
        })
        .collect();
    pick_first(algos, &mut times);
    times
}

/// `call` as either model prices it for `algo`: in at most
/// [`SIM_PIECES`] pieces a rank, and [`Algo::Direct`] on shared buffers
/// in blocks of [`shared_block`].
fn priced(call: &Call, algo: Algo) -> Call {
    let fewest = call.count / SIM_PIECES;
    let chunk = if algo == Algo::Direct && call.coll.on_shared(call.in_place) { shared_block(call.elem) } else { call.chunk };
    Call { chunk: chunk.max(fewest), ..*call }
}

/// Where the closed form and the simulator price `call` by `algo` more
/// than 10 % apart: the model's terms they price differently
/// ([`crate::sim::terms_apart`]), the call cut as the tuner cuts it.
#[cfg(feature = "internals")]
pub fn terms_apart(call: &Call, algo: Algo, hosts: &Hosts, model: &Model) -> Vec<&'static str> {
    crate::sim::terms_apart(&priced(call, algo), algo, hosts, model)
}

/// [`ranked`] for a call on shared buffers, in place or not: its
/// collective's algorithms timed out of place, and [`Algo::Direct`]
/// reading and writing the peers' buffers as the call would.
pub fn ranked_on_shared(call: &Call, in_place: bool, hosts: &Hosts, model: &Model) -> Vec<(Algo, f64)> {
    ranked_on_shared_by(call, in_place, hosts, model, true)
}

/// [`ranked_on_shared`] by the simulator, as `ccl-sim --shared` prints it.
#[cfg(feature = "internals")]
pub fn simulated_on_shared(call: &Call, in_place: bool, hosts: &Hosts, model: &Model) -> Vec<(Algo, f64)> {
    ranked_on_shared_by(call, in_place, hosts, model, false)
}

/// [`ranked_on_shared`] by the closed form or the simulator.
fn ranked_on_shared_by(call: &Call, in_place: bool, hosts: &Hosts, model: &Model, closed: bool) -> Vec<(Algo, f64)> {
    let out = Call { in_place: false, ..*call };
    let mut times = predictions_among(&out, call.coll.algos(), hosts, model, closed);
    if call.coll.on_shared(in_place) {
        let direct = predictions_among(&Call { in_place, ..*call }, &[Algo::Direct], hosts, model, closed);
        times.extend(direct);
    }
    pick_first(&candidates(call.coll, Some(in_place)), &mut times);
    times
}

/// The tuner's ranking for `call`: its [`predictions`] timed out of place,
/// whatever `call.in_place` says (see the module's notes); the first is
/// the tuner's choice for the call, in place or not.
pub fn ranked(call: &Call, hosts: &Hosts, model: &Model) -> Vec<(Algo, f64)> {
    predictions(&Call { in_place: false, ..*call }, hosts, model)
}

/// Sorts `times` fastest first, then moves to the front the algorithm
/// listed first in `listed` among those within [`TIE`] of the fastest.
pub fn pick_first(listed: &[Algo], times: &mut Vec<(Algo, f64)>) {
    times.sort_by(|a, b| a.1.total_cmp(&b.1));
    let Some(&(_, fastest)) = times.first() else { return };
    let order = |a: Algo| listed.iter().position(|&x| x == a).unwrap_or(usize::MAX);
    let tied = times.iter().enumerate().filter(|(_, t)| t.1 <= fastest * (1.0 + TIE));
    if let Some((i, _)) = tied.min_by_key(|(_, t)| order(t.0)) {
        let pick = times.remove(i);
        times.insert(0, pick);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Link;

    #[test]
    fn near_ties_go_to_the_algorithm_listed_first() {
        use Algo::*;
        let listed = Coll::AllReduce.algos();
        let mut t = vec![(RecursiveDoubling, 3.0), (Tree, 1.0), (Ring, 1.005), (HalvingDoubling, 1.5)];
        pick_first(listed, &mut t);
        assert_eq!(t, [(Ring, 1.005), (Tree, 1.0), (HalvingDoubling, 1.5), (RecursiveDoubling, 3.0)]);
        // beyond the margin the fastest stays first
        let mut t = vec![(Ring, 1.05), (Tree, 1.0)];
        pick_first(listed, &mut t);
        assert_eq!(t, [(Tree, 1.0), (Ring, 1.05)]);
        let mut none: Vec<(Algo, f64)> = Vec::new();
        pick_first(listed, &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn forced_algorithms_apply_only_where_they_fit() {
        let t = Tuner::new(Model::DEFAULT, false);
        let cfg = Config { algo: Some(Algo::Tree), ..Config::default() };
        let h = Hosts::flat(4);
        assert_eq!(t.choose(Coll::AllReduce, 1 << 18, 4, &h, &cfg, None).algo, Algo::Tree);
        assert_eq!(t.choose(Coll::AllGather, 1 << 18, 4, &h, &cfg, None).algo, Algo::Ring);
        let c = t.choose(Coll::AllReduce, 1 << 18, 4, &h, &Config { chunksize: 1 << 30, ..Config::default() }, None);
        assert_eq!(c.chunk, c.slot_elems * crate::config::NSLOTS / 2);
        // one rank per host: every connection is TCP, with fewer, larger slots
        let c = t.choose(Coll::AllReduce, 1 << 18, 4, &Hosts::blocks(&[1; 4]), &Config::default(), None);
        assert_eq!(c.slot_elems * 4, Config::default().tcp_slot_bytes());
        assert_eq!(c.chunk, c.slot_elems * crate::config::TCP_NSLOTS / 2);
    }

    #[test]
    fn tiny_pieces_are_raised_to_at_most_max_pieces_a_call() {
        let t = Tuner::new(Model::DEFAULT, false);
        let h = Hosts::flat(2);
        let tiny = Config { chunksize: 1, ..Config::default() };
        for count in [1, 1000, 1 << 16, 1 << 18, 1 << 20] {
            let c = t.choose(Coll::AllReduce, count, 4, &h, &tiny, None);
            assert!(count.div_ceil(c.chunk) <= MAX_PIECES, "{count}: chunk {}", c.chunk);
            assert!(c.chunk <= c.slot_elems * crate::config::NSLOTS / 2, "still within the slots");
        }
        // where the pieces are few enough, what was asked for
        assert_eq!(t.choose(Coll::AllReduce, 1000, 4, &h, &Config { chunksize: 64, ..Config::default() }, None).chunk, 16);
    }

    #[test]
    fn the_tuner_cuts_calls_into_whole_slots_and_pieces_of_half_the_slots() {
        use crate::config::NSLOTS;
        let t = Tuner::new(Model::DEFAULT, false);
        let (cfg, h) =
            (Config::default().on_machine(&crate::machine::Machine { ranks: 2, cpus: 2, llc: None }), Hosts::flat(2));
        for count in [1 << 18, 1 << 20, 1 << 24] {
            let c = t.choose(Coll::AllReduce, count, 4, &h, &cfg, None);
            assert_eq!((c.slot_elems, c.chunk), (16 << 10, (16 << 10) * NSLOTS / 2), "{count}");
        }
    }

    #[test]
    fn the_choice_follows_size_and_links() {
        let cfg = Config::default();
        let t = Tuner::new(Model::DEFAULT, false);
        let flat = Hosts::flat(8);
        assert_eq!(t.choose(Coll::AllReduce, 4, 4, &flat, &cfg, None).algo, Algo::RecursiveDoubling);
        assert_eq!(t.choose(Coll::AllReduce, 1 << 22, 4, &flat, &cfg, None).algo, Algo::Ring);
        // 4 hosts of 2: across a slow network the hierarchical ring sends less over each link
        let hosts = Hosts::blocks(&[2; 4]);
        let fast = Model::DEFAULT.with_inter(Link { latency: 20e-6, bandwidth: 40e9 });
        let slow = Model::DEFAULT.with_inter(Link { latency: 20e-6, bandwidth: 0.125e9 });
        t.set_model(fast);
        let a_fast = t.choose(Coll::AllReduce, 1 << 22, 4, &hosts, &cfg, None).algo;
        t.set_model(slow);
        let a_slow = t.choose(Coll::AllReduce, 1 << 22, 4, &hosts, &cfg, None).algo;
        assert_eq!(a_slow, Algo::RingRing);
        assert_ne!(a_fast, a_slow);
        // the choice is kept per size class
        assert_eq!(t.choose(Coll::AllReduce, (1 << 22) - 5, 4, &hosts, &cfg, None).algo, a_slow);
        assert_eq!(size_class(4096), 12);
        assert_eq!(size_class(4097), 13);
    }

    #[test]
    fn across_hosts_large_calls_take_the_channels_the_nics_reward_and_small_ones_one() {
        let cfg = Config::default();
        let t = Tuner::new(Model::H100, false);
        let hosts = Hosts::blocks(&[8; 8]);
        let big = t.choose(Coll::AllReduce, 1 << 28, 4, &hosts, &cfg, None);
        assert!(big.channels >= 8, "{big:?}");
        for bytes in [8usize, 4096] {
            let small = t.choose(Coll::AllReduce, bytes / 4, 4, &hosts, &cfg, None);
            assert_eq!(small.channels, 1, "{bytes} B: {small:?}");
        }
        // one NIC per host: channels cross through it all the same
        let one_nic = Tuner::new(Model { nics: 1, ..Model::H100 }, false);
        assert!(one_nic.choose(Coll::AllReduce, 1 << 28, 4, &hosts, &cfg, None).channels < big.channels);
        // one host of CPUs: one channel (of GPUs, each channel on a stream
        // of its own: as many as reward it); CCL_NCHANNELS forces, with or
        // without CCL_ALGO
        let cpus = Tuner::new(Model { streams: false, ..Model::H100 }, false);
        assert_eq!(cpus.choose(Coll::AllReduce, 1 << 28, 4, &Hosts::flat(8), &cfg, None).channels, 1);
        assert!(t.choose(Coll::AllReduce, 1 << 28, 4, &Hosts::flat(8), &cfg, None).channels > 1);
        let three = Config { nchannels: Some(3), ..Config::default() };
        assert_eq!(t.choose(Coll::AllReduce, 1 << 28, 4, &hosts, &three, None).channels, 3);
        let ring = Config { algo: Some(Algo::Ring), ..Config::default() };
        let forced = t.choose(Coll::AllReduce, 1 << 28, 4, &hosts, &ring, None);
        assert_eq!(forced.algo, Algo::Ring);
        assert!(forced.channels >= 8, "{forced:?}");
    }

    #[test]
    fn on_shared_buffers_large_calls_go_directly_and_tiny_ones_through_slots() {
        let cfg = Config::default();
        for n in [2, 4] {
            let h = Hosts::flat(n);
            for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather, Coll::Broadcast] {
                let t = Tuner::new(Model::DEFAULT, false);
                let pick = |count, shared| t.choose(coll, count, 4, &h, &cfg, shared).algo;
                assert_ne!(pick(2, Some(true)), Algo::Direct, "{coll} of 8 B on {n} ranks");
                assert_eq!(pick(1 << 20, Some(true)), Algo::Direct, "{coll} of 4 MiB on {n} ranks, in place");
                assert_ne!(pick(1 << 20, None), Algo::Direct, "{coll} of 4 MiB on private buffers");
                let choice = t.choose(coll, 1 << 20, 4, &h, &cfg, Some(true));
                assert_eq!(choice.chunk, shared_block(4), "{coll}: blocks of 32 KiB");
            }
            // out of place, broadcast cannot
            let t = Tuner::new(Model::DEFAULT, false);
            assert_ne!(t.choose(Coll::Broadcast, 1 << 20, 4, &h, &cfg, Some(false)).algo, Algo::Direct);
            // forced either way
            let forced = |a| Config { algo: Some(a), ..Config::default() };
            assert_eq!(t.choose(Coll::AllReduce, 2, 4, &h, &forced(Algo::Direct), Some(false)).algo, Algo::Direct);
            assert_eq!(t.choose(Coll::AllReduce, 1 << 20, 4, &h, &forced(Algo::Ring), Some(false)).algo, Algo::Ring);
            assert_ne!(t.choose(Coll::AllReduce, 1 << 20, 4, &h, &forced(Algo::Direct), None).algo, Algo::Direct);
        }
    }
}
