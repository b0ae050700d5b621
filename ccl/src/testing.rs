//! Ranks as threads: run an SPMD closure on `n` threads of this process,
//! each with its own [`Group`], connected by the in-process transport.
//!
//! ```
//! use ccl::{testing::run_local, Sum};
//!
//! let sums = run_local(4, |group| {
//!     let comm = group.typed::<u32>();
//!     let mut v = vec![group.rank() as u32 + 1; 3];
//!     comm.all_reduce(&mut v, Sum).map(|()| v)
//! });
//! for s in sums {
//!     assert_eq!(s.unwrap(), vec![10, 10, 10]);
//! }
//! ```

use crate::comm::Group;
use crate::config::Config;
use crate::machine::Machine;
use crate::topo::Hosts;
use crate::transport::local::Fabric;
use crate::transport::{Registry, Transport};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// A job of threads: rank count, host layout, configuration.
#[derive(Clone, Debug)]
pub struct LocalJob {
    n: usize,
    hosts: Hosts,
    config: Config,
}

impl LocalJob {
    /// `n` ranks on one host with the configuration from the environment
    /// (or the defaults, if the environment has an invalid value).
    pub fn new(n: usize) -> Self {
        LocalJob { n, hosts: Hosts::flat(n), config: Config::from_env().unwrap_or_default() }
    }

    /// Pretends the ranks live on hosts of these sizes (consecutive ranks).
    pub fn hosts(mut self, sizes: &[usize]) -> Self {
        self.hosts = Hosts::blocks(sizes);
        self
    }

    /// Uses this configuration instead.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Runs `f` on every rank, each on its own thread, and returns the
    /// results in rank order. If a rank panics, the others' pending and
    /// later calls fail with a transport error instead of hanging, and the
    /// panic is re-raised here once every thread has ended.
    ///
    /// # Panics
    ///
    /// If the host layout does not cover exactly `n` ranks, or a rank panics.
    pub fn run<R: Send>(&self, f: impl Fn(Group) -> R + Sync) -> Vec<R> {
        assert_eq!(self.hosts.nranks(), self.n, "host layout must cover every rank");
        let ring = self.config.slots_on(&self.hosts);
        let fabric = Fabric::new(self.n, ring.nslots, ring.slot_bytes);
        let endpoints: Arc<[usize]> = (0..self.n).collect();
        let outcomes: Vec<std::thread::Result<R>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.n)
                .map(|rank| {
                    let (fabric, endpoints, f) = (Arc::clone(&fabric), Arc::clone(&endpoints), &f);
                    std::thread::Builder::new()
                        .name(format!("rank-{rank}"))
                        .spawn_scoped(s, move || {
                            let out = catch_unwind(AssertUnwindSafe(|| {
                                let ep: Arc<dyn Transport> = Arc::new(fabric.endpoint(rank));
                                let registry = Arc::new(Registry::new(vec![ep]).expect("one transport"));
                                let local = self.hosts.groups().iter().find(|g| g.contains(&rank));
                                let machine = Machine::here(local.map_or(1, |g| g.len()));
                                let (hosts, config) = (self.hosts.clone(), self.config.clone());
                                let group = Group::new(rank, endpoints, hosts, config, registry, 0, machine)
                                    .expect("valid local group");
                                f(group)
                            }));
                            if out.is_err() {
                                fabric.shut_down(&format!("rank {rank} panicked"));
                            }
                            out
                        })
                        .expect("spawn rank thread")
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(Err)).collect()
        });
        outcomes.into_iter().map(|o| o.unwrap_or_else(|p| resume_unwind(p))).collect()
    }
}

/// Runs `f` on `n` ranks as threads (one host, configuration from the
/// environment); the results in rank order. See [`LocalJob`] for more.
pub fn run_local<R: Send>(n: usize, f: impl Fn(Group) -> R + Sync) -> Vec<R> {
    LocalJob::new(n).run(f)
}
