//! What a job runs, and where: the command line read into one value that
//! the host connections and the job's supervision share.

use cclrun::place::Placement;
use cclrun::ssh::SshOpts;
use std::time::Duration;

/// What to run, where.
pub struct Spec {
    /// Per rank: host and local rank.
    pub placement: Vec<Placement>,
    /// Host names by index.
    pub host_names: Vec<String>,
    /// Per host: this host itself (no SSH).
    pub local: Vec<bool>,
    /// The program as given.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (`-x`).
    pub env: Vec<(String, String)>,
    /// Prefix output lines with `[rank]`.
    pub tag_output: bool,
    /// How ranks are pinned to CPUs.
    pub bind: cclrun::proto::Bind,
    /// End the job after this long.
    pub timeout: Option<Duration>,
    /// How to reach other hosts.
    pub ssh: SshOpts,
    /// Path of cclrun on other hosts.
    pub remote_cclrun: String,
}
