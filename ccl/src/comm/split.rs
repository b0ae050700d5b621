//! `split`: new groups from some of a group's ranks, as `MPI_Comm_split`.

use super::group::Group;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Group {
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
        let (config, registry) = (self.inner.config.clone(), Arc::clone(&self.inner.registry));
        let g = Group::new(rank, endpoints, hosts, config, registry, id, *self.machine())?;
        g.inner.tuner.set_model(self.inner.tuner.model());
        Ok(Some(g))
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
