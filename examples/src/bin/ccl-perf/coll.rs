//! The collectives ccl-perf times: names, buffers, bus bandwidth factors.

/// A collective ccl-perf times.
#[derive(Clone, Copy, PartialEq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Gather,
    Scatter,
    Scan,
    Exscan,
    SendRecv,
    Halo,
    // the varying forms, timed on equal counts (as OSU's benchmarks do)
    AllGatherV,
    ReduceScatterV,
    AllToAllV,
    GatherV,
    ScatterV,
}

/// The halo's directions: each rank sends block k to rank `r + d_k` and
/// receives block k from `r - d_k` (mod n), leaving out those that come
/// back to itself: 4 neighbours from 5 ranks on, 2 on 2.
pub fn halo_dirs(n: usize) -> Vec<isize> {
    [1, -1, 2, -2].into_iter().filter(|d: &isize| d.rem_euclid(n.max(1) as isize) != 0).collect()
}

/// Rank `r`'s neighbour `d` ranks on (mod n).
pub fn neighbour(r: usize, d: isize, n: usize) -> usize {
    (r as isize + d).rem_euclid(n.max(1) as isize) as usize
}

impl Coll {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.replace('-', "_").as_str() {
            "all_reduce" | "allreduce" => Coll::AllReduce,
            "all_gather" | "allgather" => Coll::AllGather,
            "reduce_scatter" | "reducescatter" => Coll::ReduceScatter,
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "all_to_all" | "alltoall" => Coll::AllToAll,
            "gather" => Coll::Gather,
            "scatter" => Coll::Scatter,
            "scan" => Coll::Scan,
            "exscan" => Coll::Exscan,
            "sendrecv" => Coll::SendRecv,
            "halo" => Coll::Halo,
            "all_gatherv" | "allgatherv" => Coll::AllGatherV,
            "reduce_scatterv" | "reducescatterv" => Coll::ReduceScatterV,
            "all_to_allv" | "alltoallv" => Coll::AllToAllV,
            "gatherv" => Coll::GatherV,
            "scatterv" => Coll::ScatterV,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "all_to_all",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Scan => "scan",
            Coll::Exscan => "exscan",
            Coll::SendRecv => "sendrecv",
            Coll::Halo => "halo",
            Coll::AllGatherV => "all_gatherv",
            Coll::ReduceScatterV => "reduce_scatterv",
            Coll::AllToAllV => "all_to_allv",
            Coll::GatherV => "gatherv",
            Coll::ScatterV => "scatterv",
        }
    }

    /// The equal-block form of a varying call (itself for the others):
    /// what its buffers and results are, on equal counts.
    pub fn base(self) -> Coll {
        match self {
            Coll::AllGatherV => Coll::AllGather,
            Coll::ReduceScatterV => Coll::ReduceScatter,
            Coll::AllToAllV => Coll::AllToAll,
            Coll::GatherV => Coll::Gather,
            Coll::ScatterV => Coll::Scatter,
            other => other,
        }
    }

    /// Whether it is a varying call.
    #[cfg(feature = "nccl")]
    pub fn varying(self) -> bool {
        self.base() != self
    }

    /// Whether ccl has an in-place form of it (both columns time the
    /// call out of place where not).
    pub fn has_in_place(self) -> bool {
        !matches!(
            self,
            Coll::SendRecv | Coll::Halo | Coll::ReduceScatterV | Coll::AllToAllV | Coll::GatherV | Coll::ScatterV
        )
    }
    pub fn busbw_factor(self, n: usize) -> f64 {
        ccl_examples::busbw_factor(self.base().name(), n)
    }
    pub fn reduces(self) -> bool {
        matches!(self.base(), Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce | Coll::Scan | Coll::Exscan)
    }
    pub fn rooted(self) -> bool {
        matches!(self.base(), Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter)
    }
    /// Blocks of `count` elements in a size (nccl-tests' size: the
    /// largest buffer of the call).
    pub fn blocks(self, n: usize) -> usize {
        match self.base() {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::Scan | Coll::Exscan | Coll::SendRecv => 1,
            Coll::Halo => halo_dirs(n).len().max(1),
            _ => n,
        }
    }
    /// Rank `r`'s input and output lengths out of place, for `count`
    /// elements per block (a gather's and a scatter's root holds all
    /// blocks, the other ranks one).
    pub fn lens(self, (n, r, root): (usize, usize, usize), count: usize) -> (usize, usize) {
        let all = if r == root { n * count } else { 0 };
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::Scan | Coll::Exscan | Coll::SendRecv => {
                (count, count)
            }
            Coll::Halo => (halo_dirs(n).len() * count, halo_dirs(n).len() * count),
            Coll::AllGather | Coll::AllGatherV => (count, n * count),
            Coll::ReduceScatter | Coll::ReduceScatterV => (n * count, count),
            Coll::AllToAll | Coll::AllToAllV => (n * count, n * count),
            Coll::Gather | Coll::GatherV => (count, all),
            Coll::Scatter | Coll::ScatterV => (all, count),
        }
    }
}
