//! A schedule checked against its layout, once, and reused by every call
//! of the same shape ([`Checked`]), and what one call runs over it
//! ([`Plan`]): what the planner hands the executor.

use super::fingerprint;
use crate::algo::lend::Lending;
use crate::algo::{Buf, Layout, Region, Schedule, Step};
use crate::error::{Error, Result};
use crate::gpu::{Device, Kernels};
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// A schedule proven to fit a layout (every region inside its buffer,
/// fused operands identical or disjoint): checked once, then reused by
/// every call with the same shape.
/// A cached plan belongs to one communicator, whose connections its first
/// call wires.
pub struct Checked {
    pub(crate) sched: Arc<Schedule>,
    pub(crate) layout: Layout,
    /// How its steps share the call's memory with sockets
    /// ([`lend::plan`](crate::algo::lend::plan)).
    pub(crate) lending: Lending,
    /// How many ranks' buffers the schedule reaches ([`Peers`]): one past
    /// the highest rank; 0 for none.
    pub(crate) peers: usize,
    /// What the executor made of the schedule on its communicator (its
    /// connections) the first time a call ran it: opaque here.
    wired: OnceLock<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked")
            .field("sched", &self.sched)
            .field("layout", &self.layout)
            .field("lending", &self.lending)
            .field("peers", &self.peers)
            .field("wired", &self.wired.get().is_some())
            .finish()
    }
}

impl Checked {
    /// Checks `sched` against `layout`, and marks how its steps may share
    /// the call's memory with sockets.
    pub fn new(sched: Schedule, layout: Layout) -> Result<Self> {
        let peers = validate(&sched, &layout)?;
        let lending = crate::algo::lend::plan(&sched, &layout);
        Ok(Checked { sched: Arc::new(sched), layout, lending, peers, wired: OnceLock::new() })
    }

    /// Whether `peers` holds every buffer the schedule reaches.
    #[inline]
    pub(crate) fn fits(&self, peers: Option<Peers<'_>>) -> bool {
        let holds = |v: &[usize]| v.len() >= self.peers;
        let input = self.layout.in_place.is_none() && self.layout.input > 0;
        self.peers == 0 || peers.is_some_and(|p| holds(p.output) && (!input || p.input.is_some_and(holds)))
    }

    /// What the executor made of the schedule, made by `make` the first
    /// time (on the plan's first call).
    pub(crate) fn wired<W: Any + Send + Sync>(&self, make: impl FnOnce() -> Result<W>) -> Result<Arc<W>> {
        let any = match self.wired.get() {
            Some(w) => w,
            None => {
                let w: Arc<dyn Any + Send + Sync> = Arc::new(make()?);
                self.wired.get_or_init(|| w)
            }
        };
        Arc::clone(any).downcast::<W>().map_err(|_| Error::internal("a plan wired by another executor"))
    }

    /// Whether `w` is what [`wired`](Self::wired) made.
    pub(crate) fn wired_as<W>(&self, w: &Arc<W>) -> bool {
        self.wired.get().is_some_and(|a| std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(w)))
    }
}

/// What one call runs, apart from its buffers.
pub struct Plan<'a> {
    /// This rank's schedule and how input and output map onto memory
    /// (cached and reused; the call keeps only its wiring).
    pub checked: &'a Checked,
    /// Elements per slot.
    pub slot_elems: usize,
    /// The first connection channel the schedule's channels map to.
    pub channel_base: u32,
    /// The call's fingerprint, sent with and checked on every slot.
    pub fp: fingerprint::Fingerprint,
    /// A varying all-to-all's blocks on a host: its messages to and from
    /// each peer carry the count of that pair ([`Fingerprint::pair`]).
    ///
    /// [`Fingerprint::pair`]: fingerprint::Fingerprint::pair
    pub pairs: Option<std::sync::Arc<crate::algo::Blocks>>,
    /// The GPU, when the buffers are device memory (input and output are
    /// then device addresses, never dereferenced on the host); boxed, so
    /// host calls move a small `Plan`.
    pub device: Option<Box<DevCall>>,
    /// Outputs of at least this many bytes (0: none), out of place, are
    /// written with stores that go around the cache
    /// ([`ccl_kernels::copy_around_cache`]): they would not stay in it, and
    /// ordinary stores first read every line.
    pub around_cache_from: usize,
    /// Whether every slot a step fills is written around the cache (as
    /// `CCL_SLOT_STORES` and the group's measurements say); host steps only.
    pub slots_around: bool,
    /// Every rank's buffers, where the schedule reaches them (shared memory).
    pub peers: Option<Peers<'a>>,
    /// Whether a message of at most half a slot takes a new place in its
    /// slot each time the ring comes back to it ([`FifoSend::reserve`]):
    /// where every rank has a core of its own, so that the lines written
    /// have left the other core's cache; not where ranks share cores,
    /// whose messages are best kept in the few lines the core has hot.
    ///
    /// [`FifoSend::reserve`]: crate::transport::fifo::FifoSend::reserve
    pub spread: bool,
}

/// Where every rank's buffers of a call on shared memory are mapped in
/// this process (addresses by rank, this rank's own included): what the
/// schedule's peer regions ([`Buf::PeerInput`], [`Buf::PeerOutput`]) are
/// in. In place, there is no input.
#[derive(Clone, Copy, Debug)]
pub struct Peers<'a> {
    /// Each rank's send buffer.
    pub input: Option<&'a [usize]>,
    /// Each rank's receive buffer.
    pub output: &'a [usize],
}

/// A call's device: where its kernels run and what they are.
#[derive(Clone, Debug)]
pub struct DevCall {
    /// The GPU.
    pub dev: Arc<dyn Device>,
    /// The stream the call is ordered on.
    pub stream: crate::gpu::Stream,
    /// The kernels of the call's type and operator.
    pub kernels: Kernels,
    /// The device slots of connections that hand over on the GPUs, as the
    /// call is cut by them ([`Config::device_slots_on`]): as many, and as
    /// large, as the schedule's proof of progress assumes.
    ///
    /// [`Config::device_slots_on`]: crate::Config::device_slots_on
    pub slots: crate::transport::Geometry,
    /// How long its device work may wait on peers (`CCL_TIMEOUT`).
    pub timeout: std::time::Duration,
    /// The ranks to divide the result by, queued after the call's last
    /// step (Avg's finishing pass), if the call reduces.
    pub finish: Option<usize>,
    /// Whether the communicator's proxy thread finishes the call even if
    /// no connection of it is staged (`CCL_GPU_PROXY=1`).
    pub proxy: bool,
}

/// Whether a host call of `layout`, of elements of `elem` bytes, writes its
/// output around the cache, as [`Plan::around_cache_from`] (`from`) says
/// and the executor does: a large output, and not the input's buffer too.
#[inline]
pub fn writes_around(layout: &Layout, elem: usize, from: usize) -> bool {
    let out_bytes = layout.capacity(Buf::Output, 0).saturating_mul(elem);
    from > 0 && layout.in_place.is_none() && out_bytes >= from
}

/// Every region inside its buffer; fused operands identical or disjoint;
/// how many ranks' buffers the schedule reaches (then every rank's buffers
/// only as peers', its own included, and no message but notices: a
/// connection could lend nothing else).
fn validate(s: &Schedule, l: &Layout) -> Result<usize> {
    let regions = s.channels.iter().flatten().flat_map(|st| st.reads().into_iter().chain(st.writes()));
    let reached = regions.filter_map(|g| g.buf.peer()).max().map_or(0, |q| q + 1);
    let peers = reached > 0;
    for ch in &s.channels {
        for st in ch {
            let mut regs = st.reads();
            regs.extend(st.writes());
            let own = |g: &Region| matches!(g.buf, Buf::Input | Buf::Output);
            if peers && (regs.iter().any(own) || !(st.is_local() || matches!(st, Step::Notify { .. } | Step::Wait { .. }))) {
                return Err(Error::internal(format!("{st:?}: in a schedule over peers' buffers")));
            }
            for g in regs {
                let g = l.resolve(g);
                if g.end() > l.capacity(g.buf, s.scratch) {
                    return Err(Error::internal(format!("{st:?} reaches past the end of {:?}", g.buf)));
                }
            }
            if let Some(w) = st.writes() {
                let w = l.resolve(w);
                for g in st.reads() {
                    let g = l.resolve(g);
                    if g != w && g.overlaps(&w) {
                        return Err(Error::internal(format!("{st:?} has partially overlapping operands")));
                    }
                }
                // a local reduction of a region with itself would alias its operands
                if let Step::Reduce { src, .. } = st {
                    if l.resolve(*src) == w && w.len > 0 {
                        return Err(Error::internal(format!("{st:?} reduces a region with itself")));
                    }
                }
            }
        }
    }
    Ok(reached)
}
