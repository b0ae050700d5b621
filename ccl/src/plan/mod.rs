//! Planning (NCCL's enqueue): from a call (collective, count, element
//! type, operator, root, where the buffers live) to a checked, cached plan
//! the executor runs (algorithm, channels, piece size, schedule,
//! fingerprint).
//!
//! The tuner chooses; `algo` generates the schedule; the executor's
//! [`Checked`] proves it fits the call's buffers once. A group keeps its
//! plans by what determines them, and the last call's choice and plan, so
//! a loop repeating one call neither tunes nor looks up again.

mod checked;
pub mod fingerprint;
mod stores;

pub(crate) use stores::SlotChooser;

use crate::algo::{self, Blocks, Coll, Params};
use crate::config::Config;
use crate::error::{Error, Result};
pub use checked::{writes_around, Checked, DevCall, Peers, Plan};
use crate::gpu::{Kernels, Stream};
use crate::op::ReduceOp;
use crate::topo::Hosts;
use crate::tune::{self, Tuner};
use crate::Reduce;
use fingerprint::{Fingerprint, NameHashes as Names};
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

/// Channel ids from here on carry point-to-point traffic, apart from the
/// collectives' channels.
pub(crate) const P2P_CHANNEL: u32 = 1 << 16;

/// Schedules kept per group before the cache starts over.
const MAX_PLANS: usize = 256;

/// A call to plan and run.
pub(crate) struct Call<'a, T> {
    pub coll: Coll,
    pub count: usize,
    pub root: usize,
    pub input: *const T,
    pub output: *mut T,
    pub in_place: bool,
    /// Overrides the configured deadline.
    pub timeout: Option<std::time::Duration>,
    /// The stream of a call on device buffers (whose pointers are then device addresses).
    pub device: Option<Stream>,
    /// Where every rank's buffers are, when all of them are shared
    /// (`alloc_shared`) and mapped here.
    pub shared: Option<OnShared<'a>>,
    /// Every rank's block, where counts vary by rank (`count` is then
    /// unused).
    pub blocks: Option<Arc<Blocks>>,
}

/// The buffers of a call on shared memory: the input's (none in place)
/// and the output's allocations.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OnShared<'a> {
    pub input: Option<&'a Allocation>,
    pub output: &'a Allocation,
}

/// One `alloc_shared` call's buffers, as this rank sees them.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// Every rank's buffer, as mapped here (addresses by rank).
    pub bases: Box<[usize]>,
    /// Its number among its group's allocations (equal on every rank).
    pub number: u64,
    /// Calls on it as output that reached the peers' buffers.
    pub calls: std::sync::atomic::AtomicU64,
}

impl<T> Call<'_, T> {
    /// The call's name in messages (its varying form's where it has blocks).
    pub fn name(&self) -> &'static str {
        if self.blocks.is_some() {
            self.coll.name_varying()
        } else {
            self.coll.name()
        }
    }

    /// The call's count, or its largest block where counts vary: what
    /// its size class follows from.
    pub fn class_count(&self) -> usize {
        self.blocks.as_ref().map_or(self.count, |b| b.largest())
    }

    /// Bytes of the call's count (a size class, not what it moves).
    pub fn bytes(&self) -> usize {
        self.class_count().saturating_mul(std::mem::size_of::<T>())
    }

    /// The fingerprint of this call, numbered `seq`: what its peers must agree on.
    pub fn fingerprint<O: ReduceOp<T>>(&self, seq: u64) -> Fingerprint
    where
        T: Reduce,
    {
        let op_hash = if self.coll.reduces() { Names::<T, O>::op() } else { 0 };
        // a device call must not meet a host call: their types differ in the fingerprint
        let type_hash = if self.device.is_some() { Names::<T, O>::TYPE_ON_GPU } else { Names::<T, O>::TYPE };
        let fp = Fingerprint::new(self.coll, std::mem::size_of::<T>(), type_hash, op_hash, self.count, self.root, seq);
        match &self.blocks {
            Some(b) => fp.varying(b),
            None => fp,
        }
    }

    /// Where the call can run on shared buffers: `Some(in place)`.
    #[inline]
    fn on_shared(&self) -> Option<bool> {
        self.shared.as_ref().and_then(|_| self.coll.on_shared(self.in_place).then_some(self.in_place))
    }
}

/// The group a call is planned on.
pub(crate) struct On<'a> {
    pub rank: usize,
    pub size: usize,
    pub hosts: &'a Hosts,
    pub config: &'a Config,
    pub tuner: &'a Tuner,
}

/// A call ready to run, but for its buffers.
pub(crate) struct Prepared<'p> {
    pub plan: Plan<'p>,
    /// Ranks a reducing call's finishing pass divides by (`Avg`).
    pub finish_ranks: Option<usize>,
    pub timeout: std::time::Duration,
}

/// What determines a schedule on a given group: collective, algorithm,
/// count, root, channels, piece size, in place, output around the cache,
/// variable blocks.
type PlanKey = (Coll, algo::Algo, usize, usize, usize, usize, bool, bool, Option<Arc<Blocks>>);

/// What a call's choice and plan follow from on its group: collective,
/// count, root, in place, element size, on shared buffers, on a device,
/// variable blocks.
type CallKey = (Coll, usize, usize, bool, usize, bool, bool, Option<Arc<Blocks>>);

/// A group's plans: those made so far, the last call's choice and plan,
/// and how its large calls write their slots.
#[derive(Default)]
pub(crate) struct Planner {
    map: HashMap<PlanKey, Arc<Checked>>,
    /// The last call, the tuner's generation then, its choice and plan.
    last: Option<(CallKey, u64, tune::Choice, Arc<Checked>)>,
    /// How large calls write their slots under `CCL_SLOT_STORES=auto`.
    pub stores: SlotChooser,
}

impl Planner {
    /// A planner whose slot stores follow `config`.
    pub fn new(config: &Config, own_core: bool) -> Self {
        Planner { stores: SlotChooser::new(config.slot_stores, own_core), ..Planner::default() }
    }

    /// The algorithm of the last call planned.
    #[cfg(test)]
    pub fn last_algo(&self) -> Option<algo::Algo> {
        self.last.as_ref().map(|l| l.2.algo)
    }

    /// The tuner's choice for `call` and its checked schedule: the last
    /// call's if this one is the same, else from the cache or made.
    fn plan_of<T: Reduce>(&mut self, on: &On<'_>, call: &Call<'_, T>) -> Result<(tune::Choice, &Checked)> {
        let shared = call.on_shared();
        let size = std::mem::size_of::<T>();
        let device = call.device.is_some();
        let generation = on.tuner.generation();
        let repeated = matches!(&self.last, Some((k, g, _, _)) if *g == generation
            && (k.0, k.1, k.2, k.3, k.4, k.5, k.6) == (call.coll, call.count, call.root, call.in_place, size, shared.is_some(), device)
            && k.7 == call.blocks);
        if !repeated {
            let blocks = call.blocks.clone();
            let mut choice = on.tuner.choose(call.coll, call.class_count(), size, on.hosts, on.config, shared);
            let v_algos = call.coll.algos_v();
            if blocks.is_some() && !v_algos.contains(&choice.algo) {
                // (what has no variable form runs the first that has)
                choice.algo = v_algos.first().copied().ok_or_else(|| Error::internal("no variable form"))?;
            }
            if device {
                // device calls are cut by the device slots (CCL_GPU_SLOT within a host)
                let memory = call.device.as_ref().map_or(0, |s| s.dev().memory());
                let (slot_elems, most) = tune::cut(size, on.config.device_slots_on(on.hosts, memory));
                let chunk = if on.config.chunksize == 0 { most } else { choice.chunk.min(most) };
                choice = tune::Choice { slot_elems, chunk, ..choice };
            }
            let mut params = Params {
                nranks: on.size,
                rank: on.rank,
                count: call.count,
                root: call.root,
                channels: choice.channels,
                chunk: choice.chunk,
                in_place: call.in_place,
                around: false,
                hosts: on.hosts,
                blocks: blocks.as_deref(),
            };
            // the key determines the layout too (size and rank are the group's)
            let layout = params.layout(call.coll).ok_or_else(|| Error::internal("no layout"))?;
            params.around = writes_around(&layout, size, on.config.nt_stores_min());
            let (c, count, root, in_place) = (call.coll, call.count, call.root, call.in_place);
            let key = (c, choice.algo, count, root, choice.channels, choice.chunk, in_place, params.around, blocks.clone());
            let checked = match self.map.get(&key) {
                Some(c) => Arc::clone(c),
                None => {
                    let s = algo::generate(call.coll, choice.algo, &params).map_err(Error::internal)?;
                    let c = Arc::new(Checked::new(s, layout)?);
                    if self.map.len() >= MAX_PLANS {
                        self.map.clear();
                    }
                    self.map.insert(key, Arc::clone(&c));
                    c
                }
            };
            let quick = (call.coll, call.count, call.root, call.in_place, size, shared.is_some(), device, blocks);
            self.last = Some((quick, generation, choice, checked));
        }
        match &self.last {
            Some((_, _, choice, checked)) => Ok((*choice, checked)),
            None => Err(Error::internal("no plan after planning")),
        }
    }

    /// What call number `seq` runs: its plan (borrowing the cache), the
    /// ranks its finishing pass divides by, and its timeout.
    pub fn prepare<'p, T: Reduce, O: ReduceOp<T>>(
        &'p mut self,
        on: &On<'_>,
        call: &Call<'p, T>,
        seq: u64,
        slots_around: bool,
    ) -> Result<Prepared<'p>> {
        // read before the plan borrows `self`
        let own_cores = self.stores.own_cores();
        let (choice, checked) = self.plan_of::<T>(on, call)?;
        // where every rank has a core of its own
        let spread = own_cores;
        let base = if call.coll.p2p() { P2P_CHANNEL } else { 0 };
        // (a scan's rank r reduced r + 1 inputs, an exscan's r)
        let finish_ranks = match call.coll {
            algo::Coll::Scan => Some(on.rank + 1),
            algo::Coll::Exscan => (on.rank > 0).then_some(on.rank),
            c => c.reduces().then_some(on.size),
        };
        let mut fp = call.fingerprint::<O>(seq);
        // a schedule that reaches the peers' buffers: those of one allocation on every rank
        let peers = match &call.shared {
            Some(s) if choice.algo == algo::Algo::Direct && call.on_shared().is_some() => {
                fp = fp.on_shared((s.input.as_ref().map(|a| a.number), s.output.number));
                let first = s.output.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
                if first && on.config.debug >= crate::config::LogLevel::Info {
                    eprintln!(
                        "ccl: rank {}: {} #{seq} of {} bytes and later ones on these buffers: directly through \
                         shared memory",
                        on.rank,
                        call.coll.name(),
                        call.bytes()
                    );
                }
                Some(Peers { input: s.input.map(|a| &a.bases[..]), output: &s.output.bases })
            }
            _ => None,
        };
        let device = match &call.device {
            Some(s) => {
                let (dev, stream, kernels) = (Arc::clone(s.dev()), s.clone(), Kernels::of::<T, O>()?);
                let slots = on.config.device_slots_on(on.hosts, dev.memory());
                let timeout = call.timeout.unwrap_or(on.config.timeout);
                let proxy = on.config.gpu_proxy;
                Some(Box::new(DevCall { dev, stream, kernels, slots, timeout, finish: finish_ranks, proxy }))
            }
            None => None,
        };
        let pairs = call.blocks.clone().filter(|_| call.coll == algo::Coll::AllToAll && device.is_none());
        let plan = Plan {
            checked,
            slot_elems: choice.slot_elems,
            channel_base: base,
            fp,
            pairs,
            device,
            around_cache_from: on.config.nt_stores_min(),
            slots_around,
            spread,
            peers,
        };
        Ok(Prepared { plan, finish_ranks, timeout: call.timeout.unwrap_or(on.config.timeout) })
    }
}
