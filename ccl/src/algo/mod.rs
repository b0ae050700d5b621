//! Algorithms as pure functions from a call to a [`Schedule`] for one rank.
//!
//! Nothing here knows a transport, a socket or a thread: a generator sees
//! the rank count, its rank, the element count, the channel layout and the
//! host grouping, and returns steps. [`verify`] proves schedules
//! symbolically; the executor runs them.

pub mod blocks;
pub mod direct;
pub mod doubling;
pub mod hier;
pub mod lend;
pub mod part;
pub mod ring;
pub mod rooted;
pub mod scan;
pub mod schedule;
pub mod shared;
pub mod tree;
#[cfg(any(test, feature = "internals"))]
pub mod verify;

pub use blocks::Blocks;
pub use schedule::{Buf, InPlace, Layout, Region, Schedule, Step};

use crate::topo::Hosts;
use std::fmt;
use std::str::FromStr;

/// The kind of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coll {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// The root ends with the reduction of all inputs.
    Reduce,
    /// Every rank ends with the root's input.
    Broadcast,
    /// Every rank ends with all inputs, in rank order.
    AllGather,
    /// Rank `r` ends with block `r` of the reduction of all inputs.
    ReduceScatter,
    /// Rank `r` sends block `d` of its input to rank `d`.
    AllToAll,
    /// No rank leaves before every rank has entered.
    Barrier,
    /// Point-to-point send to the peer (`root`).
    Send,
    /// Point-to-point receive from the peer (`root`).
    Recv,
    /// The root ends with every rank's input, in rank order.
    Gather,
    /// Rank `r` ends with block `r` of the root's input.
    Scatter,
    /// Rank `r` ends with the reduction of ranks `0..=r`'s inputs.
    Scan,
    /// Rank `r > 0` ends with the reduction of ranks `0..r`'s inputs.
    Exscan,
}

impl Coll {
    /// Every kind, in a fixed order.
    pub const ALL: [Coll; 13] = [
        Coll::AllReduce,
        Coll::Reduce,
        Coll::Broadcast,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::Barrier,
        Coll::Send,
        Coll::Recv,
        Coll::Gather,
        Coll::Scatter,
        Coll::Scan,
        Coll::Exscan,
    ];

    /// The name used in messages (`"all_reduce"`).
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Reduce => "reduce",
            Coll::Broadcast => "broadcast",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::Barrier => "barrier",
            Coll::Send => "send",
            Coll::Recv => "recv",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Scan => "scan",
            Coll::Exscan => "exscan",
        }
    }

    /// The name of the call's form whose counts vary by rank
    /// (`"all_gatherv"`), where it has one; else [`name`](Self::name).
    pub fn name_varying(self) -> &'static str {
        match self {
            Coll::AllGather => "all_gatherv",
            Coll::ReduceScatter => "reduce_scatterv",
            Coll::AllToAll => "all_to_allv",
            Coll::Gather => "gatherv",
            Coll::Scatter => "scatterv",
            other => other.name(),
        }
    }

    /// Whether the call reduces (and so takes an operator).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter | Coll::Scan | Coll::Exscan)
    }

    /// Whether the call is point-to-point (send or recv).
    pub fn p2p(self) -> bool {
        matches!(self, Coll::Send | Coll::Recv)
    }

    /// Whether `root` names a rank (root or peer).
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Reduce | Coll::Broadcast | Coll::Send | Coll::Recv | Coll::Gather | Coll::Scatter)
    }

    /// The algorithms that implement this call, the default first.
    pub fn algos(self) -> &'static [Algo] {
        use Algo::*;
        match self {
            Coll::AllReduce => &[Ring, Tree, RecursiveDoubling, HalvingDoubling, RingRing, TreeRing],
            Coll::Reduce | Coll::Broadcast => &[Ring, Tree],
            Coll::AllGather => &[Ring, RecursiveDoubling],
            Coll::ReduceScatter => &[Ring, HalvingDoubling],
            Coll::AllToAll | Coll::Send | Coll::Recv => &[Direct],
            Coll::Barrier => &[Dissemination],
            Coll::Gather | Coll::Scatter => &[Direct, Tree],
            Coll::Scan | Coll::Exscan => &[Ring, RecursiveDoubling],
        }
    }

    /// The algorithms that implement this call with counts that vary by
    /// rank ([`Blocks`]), the default first (empty: it has no such form).
    pub fn algos_v(self) -> &'static [Algo] {
        use Algo::*;
        match self {
            Coll::AllGather | Coll::ReduceScatter => &[Ring],
            Coll::Gather | Coll::Scatter => &[Direct, Tree],
            Coll::AllToAll => &[Direct],
            _ => &[],
        }
    }

    /// Whether the call runs directly on shared buffers ([`shared`]) where
    /// every rank's buffers are mapped by every other, as
    /// [`Algo::Direct`].
    pub fn on_shared(self, in_place: bool) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::AllGather) || self == Coll::Broadcast && in_place
    }

    /// The buffers of rank `rank`'s call of `count` elements (NCCL's count:
    /// per rank for all-gather and reduce-scatter, per peer for all-to-all).
    pub fn layout(self, nranks: usize, rank: usize, count: usize, root: usize, in_place: bool) -> Layout {
        let n = nranks;
        let whole = |len: usize| InPlace { len, input_off: 0, output_off: 0 };
        let (input, output, ip) = match self {
            Coll::AllReduce => (count, count, whole(count)),
            Coll::Broadcast => (if rank == root { count } else { 0 }, count, whole(count)),
            Coll::Reduce => (count, if rank == root { count } else { 0 }, whole(count)),
            Coll::AllGather => (count, n * count, InPlace { len: n * count, input_off: rank * count, output_off: 0 }),
            Coll::ReduceScatter => {
                (n * count, count, InPlace { len: n * count, input_off: 0, output_off: rank * count })
            }
            Coll::AllToAll => (n * count, n * count, whole(n * count)),
            Coll::Barrier => (0, 0, whole(0)),
            Coll::Send => (count, 0, whole(count)),
            Coll::Recv => (0, count, whole(count)),
            Coll::Gather if rank == root => {
                (count, n * count, InPlace { len: n * count, input_off: rank * count, output_off: 0 })
            }
            Coll::Gather => (count, 0, whole(count)),
            Coll::Scatter if rank == root => {
                (n * count, count, InPlace { len: n * count, input_off: 0, output_off: rank * count })
            }
            Coll::Scatter => (0, count, whole(count)),
            Coll::Scan | Coll::Exscan => (count, count, whole(count)),
        };
        let in_place = in_place && !matches!(self, Coll::Send | Coll::Recv | Coll::Barrier);
        Layout { input, output, in_place: in_place.then_some(ip) }
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm. `CCL_ALGO` names one; calls it does not fit use their default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Ring (pipelined chain for broadcast, reduce and the scans).
    Ring,
    /// Binary tree (double binary tree for all-reduce; binomial for
    /// gather and scatter).
    Tree,
    /// Recursive doubling.
    RecursiveDoubling,
    /// Recursive halving-doubling (Rabenseifner; halving for reduce-scatter).
    HalvingDoubling,
    /// Ring inside hosts, ring across hosts.
    RingRing,
    /// Tree inside hosts, ring across hosts.
    TreeRing,
    /// Direct exchange with each peer (all-to-all, send/recv, gather and
    /// scatter at the root), or reading and writing the peers' buffers
    /// where they are shared ([`shared`]).
    Direct,
    /// Dissemination (barrier).
    Dissemination,
}

impl Algo {
    /// Every algorithm.
    pub const ALL: [Algo; 8] = [
        Algo::Ring,
        Algo::Tree,
        Algo::RecursiveDoubling,
        Algo::HalvingDoubling,
        Algo::RingRing,
        Algo::TreeRing,
        Algo::Direct,
        Algo::Dissemination,
    ];

    /// The name `CCL_ALGO` takes.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Tree => "tree",
            Algo::RecursiveDoubling => "rd",
            Algo::HalvingDoubling => "rhd",
            Algo::RingRing => "ring-ring",
            Algo::TreeRing => "tree-ring",
            Algo::Direct => "direct",
            Algo::Dissemination => "dissemination",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        Algo::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| {
            let names: Vec<_> = Algo::ALL.iter().map(|a| a.name()).collect();
            format!("unknown algorithm; expected one of {}", names.join(", "))
        })
    }
}

/// Everything a generator needs to know.
#[derive(Clone, Copy, Debug)]
pub struct Params<'a> {
    /// Ranks in the communicator.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Element count (see [`Coll::layout`]).
    pub count: usize,
    /// Root or peer, for rooted calls.
    pub root: usize,
    /// Channels to spread the data over (at least 1).
    pub channels: usize,
    /// Elements per pipeline piece (at least 1).
    pub chunk: usize,
    /// Whether input and output share one buffer.
    pub in_place: bool,
    /// Whether the output is written around the cache (large, out of
    /// place): a schedule that would read it back had better not.
    pub around: bool,
    /// Ranks per host.
    pub hosts: &'a Hosts,
    /// Every rank's block, where counts vary by rank (`count` is then
    /// unused); `None` for equal blocks of `count`.
    pub blocks: Option<&'a Blocks>,
}

/// The schedule of `algo` for `coll` on this rank, with empty steps removed.
/// An algorithm that does not implement `coll` is an error. `Direct`
/// all-reduce, reduce-scatter, all-gather and broadcast (in place) read
/// and write the peers' buffers, which the caller must have shared.
pub fn generate(coll: Coll, algo: Algo, p: &Params) -> Result<Schedule, String> {
    Ok(generate_keeping_empty(coll, algo, p)?.drop_empty())
}

/// [`generate`] with the empty steps left in: every rank of a symmetric
/// schedule then has as many steps as its images (what the simulator's
/// folding relies on, [`crate::sim`]), whatever the count.
pub fn generate_keeping_empty(coll: Coll, algo: Algo, p: &Params) -> Result<Schedule, String> {
    if p.nranks == 0 || p.rank >= p.nranks || p.hosts.nranks() != p.nranks {
        return Err(format!("rank {} of {} (hosts for {})", p.rank, p.nranks, p.hosts.nranks()));
    }
    if coll.rooted() && p.root >= p.nranks {
        return Err(format!("root {} of {}", p.root, p.nranks));
    }
    if let Some(b) = p.blocks {
        let fits = b.all.len() == p.nranks && (coll != Coll::AllToAll || b.recv.len() == p.nranks);
        if !fits || !coll.algos_v().contains(&algo) || p.layout(coll).is_none() {
            return Err(format!("{algo} {coll} of {} variable blocks for {} ranks", b.all.len(), p.nranks));
        }
    }
    let p = &Params { channels: p.channels.max(1), chunk: p.chunk.max(1), ..*p };
    use Algo::*;
    let s = match (coll, algo) {
        (Coll::AllReduce, Ring) => ring::all_reduce(p),
        (Coll::AllReduce, Tree) => tree::all_reduce(p),
        (Coll::AllReduce, RecursiveDoubling) => doubling::all_reduce_rd(p),
        (Coll::AllReduce, HalvingDoubling) => doubling::all_reduce_rhd(p),
        (Coll::AllReduce, RingRing) => hier::all_reduce_ring_ring(p),
        (Coll::AllReduce, TreeRing) => hier::all_reduce_tree_ring(p),
        (Coll::Reduce, Ring) => ring::reduce(p),
        (Coll::Reduce, Tree) => tree::reduce(p),
        (Coll::Broadcast, Ring) => ring::broadcast(p),
        (Coll::Broadcast, Tree) => tree::broadcast(p),
        (Coll::AllGather, Ring) => ring::all_gather(p),
        (Coll::AllGather, RecursiveDoubling) => doubling::all_gather_rd(p),
        (Coll::ReduceScatter, Ring) => ring::reduce_scatter(p),
        (Coll::ReduceScatter, HalvingDoubling) => doubling::reduce_scatter_rh(p),
        (Coll::AllToAll, Direct) => direct::all_to_all(p),
        (c, Direct) if c.on_shared(p.in_place) && p.blocks.is_none() => shared::schedule(c, p)?,
        (Coll::Barrier, Dissemination) => direct::barrier(p),
        (Coll::Send, Direct) => direct::send(p),
        (Coll::Recv, Direct) => direct::recv(p),
        (Coll::Gather, Direct) => rooted::gather_direct(p),
        (Coll::Gather, Tree) => rooted::gather_tree(p),
        (Coll::Scatter, Direct) => rooted::scatter_direct(p),
        (Coll::Scatter, Tree) => rooted::scatter_tree(p),
        (Coll::Scan | Coll::Exscan, Ring) => scan::chain(coll, p),
        (Coll::Scan | Coll::Exscan, RecursiveDoubling) => scan::doubling(coll, p),
        _ => return Err(format!("{algo} does not implement {coll}")),
    };
    Ok(s)
}
