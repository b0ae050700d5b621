//! Topology: which ranks share a host, and the ring order that enters and
//! leaves each host once.

use std::collections::HashMap;
use std::hash::Hash;

/// Ranks grouped by host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hosts {
    /// Host index (0..hosts, in order of first appearance) of each rank.
    host_of: Vec<usize>,
}

impl Hosts {
    /// All `n` ranks on one host.
    pub fn flat(n: usize) -> Self {
        Hosts { host_of: vec![0; n] }
    }

    /// Groups ranks by any host identity (`ids[rank]`).
    pub fn from_ids<K: Eq + Hash + Clone>(ids: &[K]) -> Self {
        let mut index: HashMap<K, usize> = HashMap::new();
        let host_of = ids
            .iter()
            .map(|k| {
                let next = index.len();
                *index.entry(k.clone()).or_insert(next)
            })
            .collect();
        Hosts { host_of }
    }

    /// `sizes[h]` consecutive ranks on host `h`.
    pub fn blocks(sizes: &[usize]) -> Self {
        Hosts { host_of: sizes.iter().enumerate().flat_map(|(h, &s)| std::iter::repeat_n(h, s)).collect() }
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    /// The host index of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of.get(rank).copied().unwrap_or(0)
    }

    /// Ranks of each host, ascending, hosts in order of first appearance.
    pub fn groups(&self) -> Vec<Vec<usize>> {
        let nh = self.host_of.iter().max().map_or(0, |m| m + 1);
        let mut g = vec![Vec::new(); nh];
        for (r, &h) in self.host_of.iter().enumerate() {
            g[h].push(r);
        }
        g
    }

    /// The ring order: host by host, ranks ascending within a host, so the
    /// ring crosses each host boundary once.
    pub fn ring(&self) -> Vec<usize> {
        self.groups().concat()
    }

    /// This communicator's hosts restricted to `members` (new rank `i` is
    /// old rank `members[i]`).
    pub fn subset(&self, members: &[usize]) -> Self {
        Hosts::from_ids(&members.iter().map(|&r| self.host_of(r)).collect::<Vec<_>>())
    }
}

/// CPUs this host gives the job: `CCL_HOST_CPUS` as cclrun sets it (the
/// CPUs it may use there, which a rank pinned by `--bind-to core` no longer
/// sees itself), else the CPUs this process may use.
pub fn host_cpus() -> usize {
    std::env::var("CCL_HOST_CPUS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |c| c.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_visits_each_host_once() {
        let h = Hosts::from_ids(&["a", "b", "a", "c", "b"]);
        assert_eq!(h.groups(), vec![vec![0, 2], vec![1, 4], vec![3]]);
        assert_eq!(h.ring(), vec![0, 2, 1, 4, 3]);
        assert_eq!(Hosts::blocks(&[2, 1]).groups(), vec![vec![0, 1], vec![2]]);
        assert_eq!(h.subset(&[1, 3, 4]).groups(), vec![vec![0, 2], vec![1]]);
    }
}
