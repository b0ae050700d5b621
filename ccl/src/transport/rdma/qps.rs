//! A connection's queue pairs (`CCL_IB_QPS_PER_CONNECTION`): messages are
//! dealt to them in turn (message `s` to queue pair `s mod k`), so that
//! several flows carry one connection, as NCCL spreads a connection over
//! several queue pairs for the links' multipath hashing.

use super::verbs::{Completion, QpInfo, QueuePair};
use super::{Link, Watch};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Queue pairs of one end, and their completion channels' watches.
pub(super) struct Qps {
    qps: Vec<Box<dyn QueuePair>>,
    got: Vec<Completion>,
    _watches: Vec<Arc<Watch>>,
}

impl Qps {
    /// `k` queue pairs of `depth` requests each way.
    pub(super) fn new(link: &Link, k: usize, depth: usize) -> Result<Self> {
        let qps = (0..k.max(1)).map(|_| link.dev().queue_pair(depth)).collect::<Result<Vec<_>>>()?;
        let watches = qps.iter().map(|q| link.watch(q.fd())).collect();
        Ok(Qps { qps, got: Vec::new(), _watches: watches })
    }

    /// How many.
    pub(super) fn len(&self) -> usize {
        self.qps.len()
    }

    /// What the peer needs to connect to each.
    pub(super) fn infos(&self) -> Vec<QpInfo> {
        self.qps.iter().map(|q| q.info()).collect()
    }

    /// Connects each to the peer's of the same index.
    pub(super) fn connect(&mut self, link: &Link, peer: &[QpInfo]) -> Result<()> {
        if peer.len() != self.qps.len() {
            return Err(Error::transport(format!(
                "rdma: rank {} has {} queue pairs per connection, this rank {}: set CCL_IB_QPS_PER_CONNECTION alike \
                 on every rank",
                link.peer,
                peer.len(),
                self.qps.len()
            )));
        }
        for (q, p) in self.qps.iter_mut().zip(peer) {
            link.check_peer(p)?;
            q.connect(p)?;
        }
        Ok(())
    }

    /// The queue pair that carries message `seq`.
    pub(super) fn of(&mut self, seq: u64) -> &mut dyn QueuePair {
        let k = self.qps.len() as u64;
        self.qps[(seq % k) as usize].as_mut()
    }

    /// Appends every ready completion to `out`, each with its queue pair's
    /// index; a queue pair found empty is armed (and looked at once more),
    /// so that its channel wakes a sleeping engine at the next one.
    pub(super) fn poll(&mut self, out: &mut Vec<(usize, Completion)>) -> Result<()> {
        for (j, q) in self.qps.iter_mut().enumerate() {
            self.got.clear();
            q.poll(&mut self.got, 64)?;
            if self.got.is_empty() {
                q.arm()?;
                q.poll(&mut self.got, 64)?;
            }
            out.extend(self.got.iter().map(|&c| (j, c)));
        }
        Ok(())
    }

    /// Forces every queue pair into the error state (fault injection).
    #[cfg(test)]
    pub(super) fn fail(&mut self) {
        self.qps.iter_mut().for_each(|q| q.fail());
    }
}
