//! [`Group`]: a communicator without an element type — who is in it, its
//! connections and queue — and the untyped calls (barrier, split).

use crate::algo::Coll;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::engine::{CallOp, Engine};
use crate::exec::{Conns, Exec};
use crate::gpu::{GpuBinding, Place, Stream};
use crate::machine::Machine;
use crate::op::ReduceOp;
use crate::plan::{Call, On, Planner, Prepared};
use crate::topo::Hosts;
use crate::transport::Registry;
use crate::{tune, BitOr, Reduce};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How long the proxy thread, or the thread driving awaited requests,
/// drives the queue before it lets a thread that makes a call in.
const PROXY_SLICE: std::time::Duration = std::time::Duration::from_micros(500);

pub(crate) struct Inner {
    pub rank: usize,
    pub size: usize,
    pub id: u64,
    pub hosts: Hosts,
    pub config: Config,
    pub tuner: tune::Tuner,
    /// The machine this rank runs on, as found at `init`.
    machine: Machine,
    pub(super) endpoints: Arc<[usize]>,
    pub(crate) registry: Arc<Registry>,
    seq: AtomicU64,
    p2p_seq: AtomicU64,
    /// The GPU of the first device call; later ones must match.
    gpu: GpuBinding,
    pub(super) splits: AtomicU64,
    /// Shared buffers allocated so far (numbers them alike on every rank).
    pub windows: AtomicU64,
    aborted: Arc<AtomicBool>,
    /// The end check has run (see [`Group::finalize`]).
    pub(super) finalized: AtomicBool,
    /// Where device calls the proxy finishes go (see [`Group::proxy`]),
    /// each with the group, which lives until the call is done.
    proxy: Mutex<Option<std::sync::mpsc::Sender<(u64, Stream, Group)>>>,
    /// Threads waiting for the state's lock to make a call: the proxy
    /// and the driver of awaited requests let them in.
    callers: AtomicUsize,
    /// Whether a thread drives the calls awaited as futures
    /// ([`Group::drive_awaited`]).
    driving: AtomicBool,
    /// The calls in flight and the schedules made so far (by what
    /// determines them: a repeated call reuses its schedule instead of
    /// generating it again), under one lock that a call takes once.
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    pub(super) engine: Engine,
    plans: Planner,
    /// The last blocking host call (a `CallOp<T, O>`), kept to run the
    /// next call of the same plan and types without setting up again; its
    /// scratch is kept with it.
    kept: Option<Box<dyn std::any::Any + Send>>,
}

/// A group of ranks that communicate: the untyped communicator.
///
/// `group.typed::<T>()` gives the typed [`Communicator<T>`](crate::Communicator) on the same
/// ranks and connections. Clones share everything; calls on one group
/// (through any of its typed handles) run in the order they are made.
#[derive(Clone)]
pub struct Group {
    pub(crate) inner: Arc<Inner>,
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
        machine: Machine,
    ) -> Result<Self> {
        let size = endpoints.len();
        if rank >= size || hosts.nranks() != size {
            return Err(Error::internal(format!("rank {rank} of {size}, hosts for {}", hosts.nranks())));
        }
        let ring = config.slots_on(&hosts);
        let conns = Conns::new(Arc::clone(&registry), id, rank, Arc::clone(&endpoints), ring);
        let own_core = machine.own_core();
        let aborted = Arc::new(AtomicBool::new(false));
        let chatty = config.debug >= crate::config::LogLevel::Info;
        let engine = Engine::new(conns, rank, own_core, Arc::clone(&aborted), chatty);
        let rules = if config.tune_file.is_empty() { None } else { Some(tune::Rules::load(&config.tune_file)?) };
        let plans = Planner::new(&config, own_core);
        let inner = Inner {
            rank,
            size,
            id,
            hosts,
            config,
            tuner: tune::Tuner::new(crate::sim::Model::DEFAULT.with_cores(machine.cpus), rank == 0),
            machine,
            endpoints,
            registry,
            seq: AtomicU64::new(0),
            p2p_seq: AtomicU64::new(0),
            gpu: GpuBinding::default(),
            splits: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            aborted,
            finalized: AtomicBool::new(false),
            proxy: Mutex::new(None),
            callers: AtomicUsize::new(0),
            driving: AtomicBool::new(false),
            state: Mutex::new(State { engine, plans, kept: None }),
        };
        if let Some(r) = rules {
            inner.tuner.set_rules(r);
        }
        Ok(Group { inner: Arc::new(inner) })
    }

    /// The machine this rank runs on.
    pub(crate) fn machine(&self) -> &Machine {
        &self.inner.machine
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

    pub(crate) fn with_engine<R>(&self, f: impl FnOnce(&mut Engine) -> Result<R>) -> Result<R> {
        self.with_state(|s| f(&mut s.engine))
    }

    pub(crate) fn next_seq(&self, coll: Coll) -> u64 {
        // send and recv involve two ranks: numbering them apart keeps the
        // collectives' numbers equal on every rank
        let counter = if matches!(coll, Coll::Send | Coll::Recv) { &self.inner.p2p_seq } else { &self.inner.seq };
        counter.fetch_add(1, Ordering::Relaxed)
    }

    /// Runs `f` holding the lock on this group's engine and plans.
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
        self.inner.callers.fetch_add(1, Ordering::SeqCst);
        let s = self.inner.state.lock();
        self.inner.callers.fetch_sub(1, Ordering::SeqCst);
        f(&mut *s.map_err(|_| Error::internal("engine lock poisoned"))?)
    }

    /// The group a call is planned on.
    fn on(&self) -> On<'_> {
        let i = &self.inner;
        On { rank: i.rank, size: i.size, hosts: &i.hosts, config: &i.config, tuner: &i.tuner }
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
        call: Call<'static, T>,
        seq: u64,
        on_done: Box<dyn FnOnce() + Send>,
    ) -> Result<u64> {
        let on = self.on();
        self.with_state(|State { engine: eng, plans, .. }| {
            eng.check_usable()?;
            let around = plans.stores.chosen(call.bytes());
            let Prepared { plan, finish_ranks, timeout } = plans.prepare::<T, O>(&on, &call, seq, around)?;
            if !call.coll.p2p() {
                eng.conns.post_call(&plan.fp.words());
            }
            // SAFETY: forwarded from this function's contract.
            let exec = unsafe { Exec::<T, O>::new(plan, call.input, call.output, &mut eng.conns)? };
            let op = CallOp { exec, finish_ranks, on_done: Some(on_done) };
            eng.submit(Box::new(op), call.name(), seq, timeout)
        })
    }

    /// Runs call number `seq` to completion.
    ///
    /// # Safety
    ///
    /// As [`submit`](Self::submit); the buffers are borrowed for the call.
    pub(crate) unsafe fn run_numbered<T: Reduce, O: ReduceOp<T>>(&self, call: Call<'_, T>, seq: u64) -> Result<()> {
        let on = self.on();
        self.with_state(|State { engine: eng, plans, kept: keep }| {
            eng.check_usable()?;
            let (around, timed) = plans.stores.pick(call.bytes(), seq);
            let on_host = call.device.is_none();
            let mut kept = keep.take().and_then(|k| k.downcast::<CallOp<T, O>>().ok());
            let Prepared { plan, finish_ranks, timeout } = plans.prepare::<T, O>(&on, &call, seq, around)?;
            // a device call's slots are written by the GPU, and one that
            // reaches the peers' buffers uses none: nothing to learn
            let timed = timed && on_host && plan.peers.is_none();
            // (the exchange of a call under CCL_CHECK=full, numbered as
            // the call, is not one to compare)
            if !call.coll.p2p() && T::NAME != crate::plan::fingerprint::CHECK_WORD {
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
            if let Some(stream) = op.exec.proxied().cloned() {
                // its work is queued as the peers' messages come: it
                // returns now, and the proxy finishes it
                let id = eng.submit(op, call.name(), seq, timeout)?;
                return self.proxy(id, stream);
            }
            let started = timed.then(std::time::Instant::now);
            eng.run(&mut *op, call.name(), seq, timeout)?;
            if let Some(t0) = started {
                let nanos = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                plans.stores.observe(call.bytes(), around, nanos);
            }
            // a device call keeps nothing on its GPU past the call
            if on_host {
                *keep = Some(op);
            }
            Ok(())
        })
    }

    /// Hands queued call `id`, a device call ordered on `stream`, to this
    /// group's proxy thread (started by the first such call), which drives
    /// the queue until the call is done, a slice at a time so that calls
    /// made meanwhile get in; a failure is reported by the next
    /// synchronisation of `stream`. Each call holds the group until it is
    /// done: dropping the communicator lets calls in flight finish (the
    /// thread ends with the group).
    fn proxy(&self, id: u64, stream: Stream) -> Result<()> {
        let mut tx = self.inner.proxy.lock().map_err(|_| Error::internal("proxy lock poisoned"))?;
        if tx.is_none() {
            let (send, calls) = std::sync::mpsc::channel::<(u64, Stream, Group)>();
            std::thread::Builder::new()
                .name(format!("ccl-proxy-{}", self.inner.rank))
                .spawn(move || {
                    while let Ok((id, stream, group)) = calls.recv() {
                        group.finish_proxied(id, &stream);
                    }
                })
                .map_err(|e| Error::internal(format!("starting the proxy thread: {e}")))?;
            *tx = Some(send);
        }
        tx.as_ref()
            .and_then(|t| t.send((id, stream, self.clone())).ok())
            .ok_or_else(|| Error::internal("the proxy thread is gone"))
    }

    /// Makes sure a thread drives this group's queue while any request is
    /// awaited as a future: it sleeps on the doorbell as a waiting call
    /// does, wakes each request's waker as its call finishes, lets a
    /// thread that makes a call in between slices, and ends once nothing
    /// is awaited.
    pub(super) fn drive_awaited(&self) -> Result<()> {
        if self.inner.driving.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let group = self.clone();
        let spawned = std::thread::Builder::new().name(format!("ccl-await-{}", self.inner.rank)).spawn(move || loop {
            let awaited = match group.inner.state.lock() {
                Ok(mut s) => {
                    s.engine.drive_until(std::time::Instant::now() + PROXY_SLICE);
                    s.engine.awaited()
                }
                Err(_) => false,
            };
            if !awaited {
                group.inner.driving.store(false, Ordering::SeqCst);
                // a request may have come to be awaited since: drive it, unless another thread does
                let again = group.with_engine(|e| Ok(e.awaited())).unwrap_or(false);
                if !again || group.inner.driving.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
            while group.inner.callers.load(Ordering::SeqCst) > 0 {
                std::thread::yield_now();
            }
        });
        spawned.map(|_| ()).map_err(|e| {
            self.inner.driving.store(false, Ordering::SeqCst);
            Error::internal(format!("starting the thread that drives awaited calls: {e}"))
        })
    }

    /// Drives the queue until call `id` is done (on the proxy thread).
    fn finish_proxied(&self, id: u64, stream: &Stream) {
        loop {
            let slice = std::time::Instant::now() + PROXY_SLICE;
            let r = match self.inner.state.lock() {
                Ok(mut s) => s.engine.wait_until(id, Some(slice)),
                Err(_) => Some(Err(Error::internal("engine lock poisoned"))),
            };
            match r {
                None => {
                    // a thread making a call goes first
                    while self.inner.callers.load(Ordering::SeqCst) > 0 {
                        std::thread::yield_now();
                    }
                }
                Some(Ok(())) => return,
                Some(Err(e)) => return crate::gpu::watch::report(stream, e),
            }
        }
    }

    pub(super) fn barrier_call(timeout: Option<std::time::Duration>) -> Call<'static, u8> {
        let p = std::ptr::NonNull::<u8>::dangling().as_ptr();
        Call {
            coll: Coll::Barrier,
            count: 0,
            root: 0,
            input: p,
            output: p,
            in_place: false,
            timeout,
            device: None,
            shared: None,
            blocks: None,
        }
    }

    /// The addresses of a call's buffers and, for device buffers, the
    /// stream it is ordered on ([`GpuBinding::resolve`]).
    pub(crate) fn resolve(
        &self,
        input: Option<Place>,
        output: Option<Place>,
    ) -> Result<(usize, usize, Option<Stream>)> {
        self.inner.gpu.resolve(input, output)
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

    pub(crate) fn check_root(&self, what: &'static str, rank: usize) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::new(ErrorKind::RankOutOfRange { what, rank, size: self.size() }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algo;

    fn last_algo(g: &Group) -> Option<Algo> {
        g.inner.state.lock().ok().and_then(|s| s.plans.last_algo())
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
    fn a_split_group_runs_on_its_parents_machine() {
        let same = crate::testing::run_local(2, |g| {
            // one rank per sub-group: it still shares the machine's cores with the other
            let alone = g.split(Some(g.rank() as u32), 0).expect("split").expect("member");
            *alone.machine() == *g.machine()
        });
        assert!(same.iter().all(|&s| s), "{same:?}");
    }
}
