//! [`Group`]: a communicator without an element type — who is in it, its
//! connections and queue — and the untyped calls (barrier, split).

use super::buffer::Place;
use super::engine::{CallOp, Engine};
use super::request::Request;
use super::stores::SlotChooser;
use super::typed::Communicator;
use crate::algo::{self, Algo, Coll, Params};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::fingerprint::{Fingerprint, NameHashes as Names};
use crate::exec::{Checked, Conns, DevCall, Exec, Plan};
use crate::gpu::{Kernels, Stream};
use crate::op::ReduceOp;
use crate::topo::Hosts;
use crate::transport::Registry;
use crate::{tune, BitOr, Reduce};
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Channel ids from here on carry point-to-point traffic, apart from the
/// collectives' channels.
pub(crate) const P2P_CHANNEL: u32 = 1 << 16;

/// What determines a schedule on a given group: collective, algorithm,
/// count, root, channels, piece size, in place.
type PlanKey = (Coll, Algo, usize, usize, usize, usize, bool);

/// What a call's choice and plan follow from on its group: collective,
/// count, root, in place, element size.
type CallKey = (Coll, usize, usize, bool, usize);

/// The schedules made so far, and the last call's choice and plan (a loop
/// repeating one call skips the tuner and the map).
#[derive(Default)]
struct Plans {
    map: HashMap<PlanKey, Arc<Checked>>,
    /// The last call, the tuner's generation then, its choice and plan.
    last: Option<(CallKey, u64, tune::Choice, Arc<Checked>)>,
    /// How large calls write their slots under `CCL_SLOT_STORES=auto`.
    stores: SlotChooser,
    /// The last blocking host call (a `CallOp<T, O>`), kept to run the
    /// next call of the same plan and types without setting up again; its
    /// scratch is kept with it.
    kept: Option<Box<dyn std::any::Any + Send>>,
}

/// Schedules kept per group before the cache starts over.
const MAX_PLANS: usize = 256;

pub(crate) struct Inner {
    pub rank: usize,
    pub size: usize,
    pub id: u64,
    pub hosts: Hosts,
    pub config: Config,
    /// How this group's connections are cut (`config.slots_on(hosts)`).
    ring: crate::transport::Geometry,
    pub tuner: tune::Tuner,
    endpoints: Arc<[usize]>,
    pub(crate) registry: Arc<Registry>,
    seq: AtomicU64,
    p2p_seq: AtomicU64,
    /// The GPU (context) of the first device call; later ones must match.
    gpu: Mutex<Option<(u64, String)>>,
    splits: AtomicU64,
    /// Shared buffers allocated so far (numbers them alike on every rank).
    pub windows: AtomicU64,
    aborted: Arc<AtomicBool>,
    /// The calls in flight and the schedules made so far (by what
    /// determines them: a repeated call reuses its schedule instead of
    /// generating it again), under one lock that a call takes once.
    state: Mutex<State>,
}

struct State {
    engine: Engine,
    plans: Plans,
}

impl Drop for Inner {
    /// Says so where this rank's last calls differ from a peer's of its
    /// host: a call whose ranks disagreed on its root or count may have
    /// ended on each of them without an error.
    fn drop(&mut self) {
        if self.config.debug < crate::config::LogLevel::Warn || self.size < 2 {
            return;
        }
        let Ok(State { engine, .. }) = self.state.get_mut() else { return };
        if engine.check_usable().is_ok() {
            let local = self.hosts.groups().into_iter().find(|g| g.contains(&self.rank)).unwrap_or_default();
            if let Some(note) = super::agree::note_on_drop(&engine.conns, self.rank, &local) {
                eprintln!("{note}");
            }
        }
    }
}

/// A group of ranks that communicate: the untyped communicator.
///
/// `group.typed::<T>()` gives the typed [`Communicator<T>`] on the same
/// ranks and connections. Clones share everything; calls on one group
/// (through any of its typed handles) run in the order they are made.
#[derive(Clone)]
pub struct Group {
    pub(crate) inner: Arc<Inner>,
}

/// A call ready to run, but for its buffers.
struct Prepared<'p> {
    plan: Plan<'p>,
    finish_ranks: Option<usize>,
    timeout: std::time::Duration,
}

/// What a submitted call runs on.
pub(crate) struct Call<T> {
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
}

impl<T> Call<T> {
    /// Bytes of the call's count (a size class, not what it moves).
    fn bytes(&self) -> usize {
        self.count.saturating_mul(std::mem::size_of::<T>())
    }
}

impl Group {
    /// A group of `endpoints.len()` ranks on `registry`; this is rank `rank`.
    pub(crate) fn new(
        rank: usize,
        endpoints: Arc<[usize]>,
        hosts: Hosts,
        config: Config,
        registry: Arc<Registry>,
        id: u64,
    ) -> Result<Self> {
        let size = endpoints.len();
        if rank >= size || hosts.nranks() != size {
            return Err(Error::internal(format!("rank {rank} of {size}, hosts for {}", hosts.nranks())));
        }
        let ring = config.slots_on(&hosts);
        let conns = Conns::new(Arc::clone(&registry), id, rank, Arc::clone(&endpoints), ring);
        let local = hosts.groups().iter().find(|g| g.contains(&rank)).map_or(1, Vec::len);
        let cores = crate::topo::host_cpus();
        let own_core = local <= cores;
        let aborted = Arc::new(AtomicBool::new(false));
        let chatty = config.debug >= crate::config::LogLevel::Info;
        let engine = Engine::new(conns, rank, own_core, Arc::clone(&aborted), chatty);
        let rules = if config.tune_file.is_empty() { None } else { Some(tune::Rules::load(&config.tune_file)?) };
        let plans = Plans { stores: SlotChooser::new(config.slot_stores, own_core), ..Plans::default() };
        let inner = Inner {
            rank,
            size,
            id,
            hosts,
            config,
            ring,
            tuner: tune::Tuner::new(crate::sim::Model::DEFAULT.with_cores(cores), rank == 0),
            endpoints,
            registry,
            seq: AtomicU64::new(0),
            p2p_seq: AtomicU64::new(0),
            gpu: Mutex::new(None),
            splits: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            aborted,
            state: Mutex::new(State { engine, plans }),
        };
        if let Some(r) = rules {
            inner.tuner.set_rules(r);
        }
        Ok(Group { inner: Arc::new(inner) })
    }

    /// Tells the engine that `ranks` processes of the job (this one
    /// included) share this machine's cores, even if `CCL_HOSTID` makes
    /// them separate hosts: it then spins only as long as fits, and writes
    /// slots through the cache unless every rank has a core.
    pub(crate) fn share_cores_with(&self, ranks: usize) {
        self.set_own_core(ranks <= crate::topo::host_cpus());
    }

    /// Whether this rank has a core of its own: it spins long, spreads
    /// small messages and learns how to write large calls' slots only then.
    fn set_own_core(&self, own_core: bool) {
        if let Ok(mut s) = self.inner.state.lock() {
            s.engine.set_own_core(own_core);
            s.plans.stores.set_own_cores(own_core);
        }
    }

    fn own_core(&self) -> bool {
        self.inner.state.lock().map_or(true, |s| s.plans.stores.own_cores())
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// Which ranks share a host.
    pub fn hosts(&self) -> &Hosts {
        &self.inner.hosts
    }

    /// The configuration calls follow.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The typed communicator for elements of `T` on this group.
    pub fn typed<T: Reduce>(&self) -> Communicator<T> {
        Communicator::new(self.clone())
    }

    pub(crate) fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> Result<R>) -> Result<R> {
        self.with_state(|e, _| f(e))
    }

    pub(crate) fn next_seq(&self, coll: Coll) -> u64 {
        // send and recv involve two ranks: numbering them apart keeps the
        // collectives' numbers equal on every rank
        let counter = if matches!(coll, Coll::Send | Coll::Recv) { &self.inner.p2p_seq } else { &self.inner.seq };
        counter.fetch_add(1, Ordering::Relaxed)
    }

    /// The tuner's choice for `call` and its checked schedule: the last
    /// call's if this one is the same, else from the plan cache or made.
    fn plan_of<'p, T: Reduce>(&self, plans: &'p mut Plans, call: &Call<T>) -> Result<(tune::Choice, &'p Checked)> {
        let inner = &self.inner;
        let quick: CallKey = (call.coll, call.count, call.root, call.in_place, std::mem::size_of::<T>());
        let generation = inner.tuner.generation();
        let repeated = matches!(&plans.last, Some((k, g, _, _)) if *k == quick && *g == generation);
        if !repeated {
            let choice =
                inner.tuner.choose(call.coll, call.count, std::mem::size_of::<T>(), &inner.hosts, &inner.config);
            // the key determines the layout too (size and rank are the group's)
            let key = (call.coll, choice.algo, call.count, call.root, choice.channels, choice.chunk, call.in_place);
            let checked = match plans.map.get(&key) {
                Some(c) => Arc::clone(c),
                None => {
                    let params = Params {
                        nranks: inner.size,
                        rank: inner.rank,
                        count: call.count,
                        root: call.root,
                        channels: choice.channels,
                        chunk: choice.chunk,
                        in_place: call.in_place,
                        hosts: &inner.hosts,
                    };
                    let layout = call.coll.layout(inner.size, inner.rank, call.count, call.root, call.in_place);
                    let s = algo::generate(call.coll, choice.algo, &params).map_err(Error::internal)?;
                    let c = Arc::new(Checked::new(s, layout)?);
                    if plans.map.len() >= MAX_PLANS {
                        plans.map.clear();
                    }
                    plans.map.insert(key, Arc::clone(&c));
                    c
                }
            };
            plans.last = Some((quick, generation, choice, checked));
        }
        match &plans.last {
            Some((_, _, choice, checked)) => Ok((*choice, checked)),
            None => Err(Error::internal("no plan after planning")),
        }
    }

    /// What call number `seq` runs: its plan (borrowing `plans`), the
    /// ranks its finishing pass divides by, and its timeout.
    fn prepare<'p, T: Reduce, O: ReduceOp<T>>(
        &self,
        plans: &'p mut Plans,
        call: &Call<T>,
        seq: u64,
        slots_around: bool,
    ) -> Result<Prepared<'p>> {
        let inner = &self.inner;
        // read before the plan borrows `plans`
        let own_cores = plans.stores.own_cores();
        let (choice, checked) = self.plan_of::<T>(plans, call)?;
        // where every rank has a core; a call filling only part of each
        // slot keeps to that part (tune::slot_fill)
        let size = std::mem::size_of::<T>();
        let spread = own_cores && choice.slot_elems * size > inner.ring.slot_bytes / 2;
        let base = if matches!(call.coll, Coll::Send | Coll::Recv) { P2P_CHANNEL } else { 0 };
        let finish_ranks = call.coll.reduces().then_some(inner.size);
        let fp = Self::fingerprint::<T, O>(call, seq);
        let device = match &call.device {
            Some(s) => {
                Some(Box::new(DevCall { dev: Arc::clone(s.dev()), stream: s.raw(), kernels: Kernels::of::<T, O>()? }))
            }
            None => None,
        };
        let around_cache_from = inner.config.nt_stores_min();
        let plan = Plan {
            checked,
            slot_elems: choice.slot_elems,
            channel_base: base,
            fp,
            device,
            around_cache_from,
            slots_around,
            spread,
        };
        Ok(Prepared { plan, finish_ranks, timeout: call.timeout.unwrap_or(inner.config.timeout) })
    }

    /// The fingerprint of `call`, numbered `seq`: what its peers must agree on.
    pub(crate) fn fingerprint<T: Reduce, O: ReduceOp<T>>(call: &Call<T>, seq: u64) -> Fingerprint {
        let op_hash = if call.coll.reduces() { Names::<T, O>::OP } else { 0 };
        // a device call must not meet a host call: their types differ in the fingerprint
        let type_hash = if call.device.is_some() { Names::<T, O>::TYPE_ON_GPU } else { Names::<T, O>::TYPE };
        Fingerprint::new(call.coll, std::mem::size_of::<T>(), type_hash, op_hash, call.count, call.root, seq)
    }

    /// Under `CCL_CHECK=full`, exchanges collective `call`'s fingerprint
    /// with every rank first: `Err` where any differs.
    pub(crate) fn agree<T: Reduce, O: ReduceOp<T>>(&self, call: &Call<T>, seq: u64) -> Result<()> {
        if self.inner.config.check != crate::config::CheckMode::Full || call.coll.p2p() || self.inner.size < 2 {
            return Ok(());
        }
        super::agree::all_agree(self, Self::fingerprint::<T, O>(call, seq))
    }

    /// Runs `f` holding the lock on this group's engine and plans.
    fn with_state<R>(&self, f: impl FnOnce(&mut Engine, &mut Plans) -> Result<R>) -> Result<R> {
        let mut s = self.inner.state.lock().map_err(|_| Error::internal("engine lock poisoned"))?;
        let State { engine, plans } = &mut *s;
        f(engine, plans)
    }

    /// Plans and queues a call; `on_done` runs when it has finished. The
    /// id to wait on.
    ///
    /// # Safety
    ///
    /// The call's buffers must stay valid and untouched by anyone else until
    /// the returned call has finished or failed (see [`Exec::new`]).
    pub(crate) unsafe fn submit<T: Reduce, O: ReduceOp<T>>(
        &self,
        call: Call<T>,
        seq: u64,
        on_done: Box<dyn FnOnce() + Send>,
    ) -> Result<u64> {
        self.with_state(|eng, plans| {
            eng.check_usable()?;
            let around = plans.stores.chosen(call.bytes());
            let Prepared { plan, finish_ranks, timeout } = self.prepare::<T, O>(plans, &call, seq, around)?;
            if !call.coll.p2p() {
                eng.conns.post_call(&plan.fp.words());
            }
            // SAFETY: forwarded from this function's contract.
            let exec = unsafe { Exec::<T, O>::new(plan, call.input, call.output, &mut eng.conns)? };
            let op = CallOp { exec, finish_ranks, on_done: Some(on_done) };
            eng.submit(Box::new(op), call.coll.name(), seq, timeout)
        })
    }

    /// Runs call number `seq` to completion.
    ///
    /// # Safety
    ///
    /// As [`submit`](Self::submit); the buffers are borrowed for the call.
    pub(crate) unsafe fn run_numbered<T: Reduce, O: ReduceOp<T>>(&self, call: Call<T>, seq: u64) -> Result<()> {
        self.with_state(|eng, plans| {
            eng.check_usable()?;
            let (around, timed) = plans.stores.pick(call.bytes(), seq);
            // a device call's slots are written by the GPU: nothing to learn
            let on_host = call.device.is_none();
            let timed = timed && on_host;
            let mut kept = plans.kept.take().and_then(|k| k.downcast::<CallOp<T, O>>().ok());
            let Prepared { plan, finish_ranks, timeout } = self.prepare::<T, O>(plans, &call, seq, around)?;
            // (the exchange of a call under CCL_CHECK=full, numbered as
            // the call, is not one to compare)
            if !call.coll.p2p() && T::NAME != crate::exec::fingerprint::CHECK_WORD {
                eng.conns.post_call(&plan.fp.words());
            }
            // SAFETY: forwarded; `run` returns only once the call has
            // finished or failed and left the queue, before the borrow ends.
            let reused = kept.as_mut().is_some_and(|k| unsafe { k.exec.reuse(&plan, call.input, call.output) });
            let mut op = match kept {
                Some(k) if reused => k,
                _ => {
                    // SAFETY: as for `reuse` above.
                    let exec = unsafe { Exec::<T, O>::new(plan, call.input, call.output, &mut eng.conns)? };
                    let op = CallOp { exec, finish_ranks, on_done: None };
                    match kept {
                        Some(mut k) => {
                            *k = op;
                            k
                        }
                        None => Box::new(op),
                    }
                }
            };
            let started = timed.then(std::time::Instant::now);
            eng.run(&mut *op, call.coll.name(), seq, timeout)?;
            if let Some(t0) = started {
                let nanos = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                plans.stores.observe(call.bytes(), around, nanos);
            }
            // a device call keeps nothing on its GPU past the call
            if on_host {
                plans.kept = Some(op);
            }
            Ok(())
        })
    }

    fn barrier_call(timeout: Option<std::time::Duration>) -> Call<u8> {
        let p = std::ptr::NonNull::<u8>::dangling().as_ptr();
        Call { coll: Coll::Barrier, count: 0, root: 0, input: p, output: p, in_place: false, timeout, device: None }
    }

    /// The addresses of a call's buffers and, for device buffers, the
    /// stream it is ordered on; errors for host and device memory mixed,
    /// memory of another GPU or context than the stream's, or a GPU other
    /// than this communicator's first device call used.
    pub(crate) fn resolve(
        &self,
        input: Option<Place>,
        output: Option<Place>,
    ) -> Result<(usize, usize, Option<Stream>)> {
        let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr() as usize;
        // host memory, the common case: nothing to check
        let host = |p: &Option<Place>| match p {
            Some(Place::Host(ptr)) => Some(*ptr as usize),
            None => Some(dangling),
            Some(Place::Device { .. }) => None,
        };
        if let (Some(i), Some(o)) = (host(&input), host(&output)) {
            return Ok((i, o, None));
        }
        let kind = |p: &Option<Place>| match p {
            Some(Place::Host(_)) => "host memory",
            Some(Place::Device { .. }) => "device memory",
            None => "absent",
        };
        let (ki, ko) = (kind(&input), kind(&output));
        if ki != ko && ki != "absent" && ko != "absent" {
            return Err(Error::invalid(format!(
                "the input buffer is {ki} but the output buffer is {ko}: pass both on the GPU or both on the host"
            )));
        }
        let mut stream: Option<Stream> = None;
        let mut addr = |p: Option<Place>| -> Result<usize> {
            match p {
                None => Ok(dangling),
                Some(Place::Host(ptr)) => Ok(ptr as usize),
                Some(Place::Device { ptr, stream: s, check }) => {
                    check?;
                    if let Some(first) = &stream {
                        if first.dev().context() != s.dev().context() {
                            return Err(Error::device(format!(
                                "the input buffer is on {} but the output buffer is on {}",
                                s.dev().describe(),
                                first.dev().describe()
                            )));
                        }
                    } else {
                        stream = Some(s);
                    }
                    Ok(ptr as usize)
                }
            }
        };
        // the output's stream orders the call: resolve it first
        let o = addr(output)?;
        let i = addr(input)?;
        if let Some(s) = &stream {
            let dev = s.dev();
            let ctx = dev.stream_context(s.raw())?;
            if ctx != dev.context() {
                return Err(Error::device(format!("the stream belongs to another context than {}", dev.describe())));
            }
            let mut bound = self.inner.gpu.lock().map_err(|_| Error::internal("gpu lock poisoned"))?;
            match &*bound {
                Some((c, name)) if *c != ctx => {
                    return Err(Error::device(format!(
                        "this communicator runs on {name}; a buffer on {} cannot join it (one GPU per rank and communicator)",
                        dev.describe()
                    )))
                }
                Some(_) => {}
                None => *bound = Some((ctx, dev.describe())),
            }
        }
        Ok((i, o, stream))
    }

    /// Ends every pending and future call of this group, on this rank, with
    /// [`ErrorKind::Aborted`]; callable from any thread (a watchdog, a
    /// signal-handling thread). Other ranks see this rank go quiet and fail
    /// by their own deadlines or lost-peer checks.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        self.inner.registry.ring();
    }

    /// Blocks until every rank of the group has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.barrier_within(None)
    }

    /// [`barrier`](Self::barrier) with a deadline other than `CCL_TIMEOUT`'s.
    pub(crate) fn barrier_within(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        let seq = self.next_seq(Coll::Barrier);
        // SAFETY: a barrier touches no user buffer (only its own scratch).
        unsafe { self.run_numbered::<u8, BitOr>(Self::barrier_call(timeout), seq) }
            .map_err(|e| e.in_call("barrier", seq).at_rank(self.rank()))
    }

    /// A barrier that completes in the background.
    pub fn ibarrier(&self) -> Request<()> {
        let seq = self.next_seq(Coll::Barrier);
        let call = Self::barrier_call(None);
        let slot = Arc::new(Mutex::new(None));
        let s2 = Arc::clone(&slot);
        let done: Box<dyn FnOnce() + Send> = Box::new(move || {
            if let Ok(mut s) = s2.lock() {
                *s = Some(());
            }
        });
        // SAFETY: no user buffer.
        match unsafe { self.submit::<u8, BitOr>(call, seq, done) } {
            Ok(id) => Request::new(self.clone(), id, slot),
            Err(e) => Request::failed(self.clone(), e.in_call("barrier", seq).at_rank(self.rank())),
        }
    }

    /// Splits the group like `MPI_Comm_split`: ranks passing the same
    /// `color` form a new group, ordered by `key` then by their rank here.
    /// A rank passing `None` takes part in the exchange but joins no group
    /// and gets `Ok(None)`. Every rank of this group must call it.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Group>> {
        let n = self.size();
        let mine = [color.map_or(-1, i64::from), key];
        let mut table = vec![0i64; 2 * n];
        self.typed::<i64>().all_gather(&mine, &mut table)?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> =
            (0..n).filter(|&r| table[2 * r] == i64::from(color)).map(|r| (table[2 * r + 1], r)).collect();
        members.sort_unstable();
        let ranks: Vec<usize> = members.iter().map(|&(_, r)| r).collect();
        let rank =
            ranks.iter().position(|&r| r == self.rank()).ok_or_else(|| Error::internal("split lost this rank"))?;
        let endpoints: Arc<[usize]> = ranks.iter().map(|&r| self.inner.endpoints[r]).collect();
        let nth = self.inner.splits.fetch_add(1, Ordering::Relaxed);
        let id = fnv(&[self.inner.id, nth, u64::from(color)]);
        let hosts = self.inner.hosts.subset(&ranks);
        let g = Group::new(rank, endpoints, hosts, self.inner.config.clone(), Arc::clone(&self.inner.registry), id)?;
        g.inner.tuner.set_model(self.inner.tuner.model());
        // the machine's other ranks still share its cores with this one
        if !self.own_core() {
            g.set_own_core(false);
        }
        Ok(Some(g))
    }

    pub(crate) fn check_root(&self, what: &'static str, rank: usize) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::new(ErrorKind::RankOutOfRange { what, rank, size: self.size() }));
        }
        Ok(())
    }
}

/// FNV-1a over words: a communicator id every member derives alike.
fn fnv(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_algo(g: &Group) -> Option<Algo> {
        g.inner.state.lock().ok().and_then(|s| s.plans.last.as_ref().map(|l| l.2.algo))
    }

    #[test]
    fn a_repeated_call_follows_rules_set_after_it() {
        let algos = crate::testing::run_local(2, |g| {
            let c = g.typed::<f32>();
            let mut v = vec![g.rank() as f32; 64];
            let mut seen = Vec::new();
            for algo in ["ring", "rd", "tree"] {
                let rule = format!("all_reduce 2 1 256 {algo}\n");
                g.inner.tuner.set_rules(tune::Rules::parse(&rule, "test").expect("rules"));
                // twice: the second call is served from the last-call memo
                for _ in 0..2 {
                    v.iter_mut().for_each(|x| *x = g.rank() as f32);
                    c.all_reduce(&mut v, crate::Sum).expect("all_reduce");
                    assert!(v.iter().all(|&x| x == 1.0), "sum of ranks 0 and 1");
                    seen.push(last_algo(&g));
                }
            }
            seen
        });
        let want = [Algo::Ring, Algo::Ring, Algo::RecursiveDoubling, Algo::RecursiveDoubling, Algo::Tree, Algo::Tree];
        for seen in algos {
            assert_eq!(seen, want.map(Some).to_vec());
        }
    }

    #[test]
    fn a_split_group_shares_cores_when_its_parent_does() {
        let owns = crate::testing::run_local(2, |g| {
            // one rank per sub-group: on its own it would count as having a core
            let alone = g.split(Some(g.rank() as u32), 0).expect("split").expect("member");
            g.share_cores_with(usize::MAX);
            let shared = g.split(Some(g.rank() as u32), 0).expect("split").expect("member");
            (alone.own_core(), g.own_core(), shared.own_core())
        });
        assert!(owns.iter().all(|&o| o == (true, false, false)), "{owns:?}");
    }
}
