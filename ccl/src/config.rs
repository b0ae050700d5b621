//! Every `CCL_*` knob, declared once: name, type, default, one-line doc.
//! The README's table is checked against [`KNOBS`] by a test.

use crate::algo::Algo;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Geometry;
use std::time::Duration;

/// Slots per connection in memory (shared memory, threads; NCCL's
/// `NCCL_STEPS`). Many small ones rather than a few large: calls of one
/// slot or less then come back to a slot's memory only after 32 others,
/// when its lines have left both cores' private caches, and calls of a few
/// slots pipeline (`bench/results/buffsize.md`).
pub const NSLOTS: usize = 32;

/// Slots per connection where every connection of a group is TCP: two
/// (double buffering, which the schedule verifier proves enough), each
/// half the connection's memory, since a socket moves large frames best
/// (`bench/results/tcp-slots.md`). A piece is still half the connection's
/// memory.
pub const TCP_NSLOTS: usize = 2;

/// Device slots per connection within a host (as `NCCL_STEPS`): the
/// streams hand them over by flags, so a few large ones keep a copy
/// engine or the kernels busy while the next fills.
pub const GPU_NSLOTS: usize = 8;

/// Slot memory per connection where `CCL_BUFFSIZE` is auto, unless
/// [`BUFFSIZE_OWN_CORES`] applies.
pub const BUFFSIZE: usize = 1 << 20;

/// Slot memory per connection where `CCL_BUFFSIZE` is auto and every rank
/// of the machine has a core of its own and talks through memory
/// ([`Config::on_machine`]): 32 slots of 64 KiB, so that a call's
/// messages come back to the same lines only after 2 MiB of others, when
/// they have left both cores' private caches, and messages of up to
/// 32 KiB move around inside their slots (the FIFO's spreading). Ranks
/// that share cores keep [`BUFFSIZE`]: their hot lines are the core's own,
/// and smaller slots pipeline a ring's steps finer. Measurements:
/// `bench/results/buffsize.md`.
pub const BUFFSIZE_OWN_CORES: usize = 2 << 20;

/// Outputs from which `CCL_NT_STORES_MIN=auto` writes around the cache
/// where the last-level cache is unknown (or not yet looked at,
/// [`Config::on_machine`]).
pub const NT_STORES_MIN: usize = 16 << 20;

/// The least output `CCL_NT_STORES_MIN=auto` writes around the cache,
/// however many ranks share it: smaller outputs are a few lines per rank.
pub const NT_STORES_FLOOR: usize = 256 << 10;

/// How much ccl prints to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Nothing.
    None,
    /// Problems only.
    #[default]
    Warn,
    /// The choice of algorithm per call and size class.
    Info,
    /// Everything.
    Trace,
}

/// A knob's declaration, for documentation and checks.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// Environment variable.
    pub var: &'static str,
    /// Default, as written in the README.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// Parses one knob's value.
pub trait KnobValue: Sized {
    /// Parses `s`, or says why not.
    fn parse_knob(s: &str) -> std::result::Result<Self, String>;
}

impl KnobValue for usize {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        crate::units::bytes(s).ok_or_else(|| "expected a non-negative integer (K, M, G suffixes allowed)".to_string())
    }
}

/// The longest deadline a knob may set (about three years).
const MAX_SECONDS: f64 = 1e8;

impl KnobValue for Option<usize> {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            other => usize::parse_knob(other).map(Some).map_err(|e| format!("{e}, or auto")),
        }
    }
}

impl KnobValue for Duration {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0 && *v <= MAX_SECONDS)
            .and_then(|v| Duration::try_from_secs_f64(v).ok())
            .ok_or_else(|| format!("expected a positive number of seconds, at most {MAX_SECONDS:e}"))
    }
}

impl KnobValue for Option<Algo> {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            other => other.parse().map(Some),
        }
    }
}

impl KnobValue for bool {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err("expected 0 or 1".into()),
        }
    }
}

impl KnobValue for String {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        Ok(s.trim().to_string())
    }
}

/// How senders write the slots of memory connections (`CCL_SLOT_STORES`).
///
/// Through the cache is fastest when the sender's and receiver's cores
/// share a cache; where they do not (other chiplets or sockets), a line
/// written through the cache must be fetched from the writer's, and
/// streaming stores to memory run faster. Which holds can change while a
/// job runs (a VM's vCPUs moved), and the time of single steps does not
/// show it, so `Auto` times whole calls (`bench/results/slot-stores.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlotStores {
    /// Whichever way the group's blocking calls of a size class measure
    /// faster, with a few calls trying the other way (`plan::stores`);
    /// non-blocking calls follow that choice, calls under 256 KiB use the cache.
    #[default]
    Auto,
    /// Through the cache.
    Cache,
    /// Around it, with streaming stores.
    Around,
}

impl KnobValue for SlotStores {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(SlotStores::Auto),
            "cache" => Ok(SlotStores::Cache),
            "around" => Ok(SlotStores::Around),
            _ => Err("expected auto, cache or around".into()),
        }
    }
}

/// A fault the software RDMA provider injects (`CCL_IB_SOFT_FAULT`), so
/// that tests can see what a NIC's errors do to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftFault {
    /// What goes wrong.
    pub kind: SoftFaultKind,
    /// The rank whose device injects it.
    pub rank: usize,
    /// Its device's write (counted from 1) that meets it.
    pub at: u64,
}

/// What a [`SoftFault`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftFaultKind {
    /// The write names the peer's region by a wrong rkey.
    Rkey,
    /// The write's queue pair is forced to the error state instead.
    Error,
}

impl KnobValue for Option<SoftFault> {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let why = || "expected rkey:RANK:N or error:RANK:N (N counted from 1), or empty".to_string();
        let mut it = s.split(':');
        let kind = match it.next().map(str::to_ascii_lowercase).as_deref() {
            Some("rkey") => SoftFaultKind::Rkey,
            Some("error") => SoftFaultKind::Error,
            _ => return Err(why()),
        };
        let rank = it.next().and_then(|r| r.parse().ok()).ok_or_else(why)?;
        let at = it.next().and_then(|n| n.parse().ok()).filter(|&n| n > 0).ok_or_else(why)?;
        if it.next().is_some() {
            return Err(why());
        }
        Ok(Some(SoftFault { kind, rank, at }))
    }
}

/// How ranks check that they make the same calls (`CCL_CHECK`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CheckMode {
    /// Every message's fingerprint is checked; calls that send the
    /// disagreeing ranks nothing to check (roots or counts that differ)
    /// are found while a rank waits on a peer (they compare their last
    /// calls), at the next call, or with a warning when the communicator
    /// is dropped.
    #[default]
    Default,
    /// Also, every collective first exchanges its fingerprint with every
    /// rank (one small all-gather more per call), so any disagreement
    /// fails the call itself on every rank, naming both calls.
    Full,
}

impl KnobValue for CheckMode {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "default" => Ok(CheckMode::Default),
            "full" => Ok(CheckMode::Full),
            _ => Err("expected default or full".into()),
        }
    }
}

impl KnobValue for LogLevel {
    fn parse_knob(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_uppercase().as_str() {
            "NONE" | "" => Ok(LogLevel::None),
            "WARN" => Ok(LogLevel::Warn),
            "INFO" => Ok(LogLevel::Info),
            "TRACE" => Ok(LogLevel::Trace),
            _ => Err("expected NONE, WARN, INFO or TRACE".into()),
        }
    }
}

macro_rules! knobs {
    ($($(#[doc = $doc:literal])* $field:ident: $ty:ty = $default:expr, $var:literal, $shown:literal;)*) => {
        /// The configuration of a communicator: defaults, overridden by
        /// `CCL_*` environment variables, overridable in code.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Config {
            $($(#[doc = $doc])* pub $field: $ty,)*
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $($field: $default,)* }
            }
        }

        /// Every knob, in README order.
        pub const KNOBS: &[Knob] = &[$(Knob { var: $var, default: $shown, doc: concat!($($doc),*) },)*];

        impl Config {
            /// Defaults overridden by whatever `lookup` returns for each variable.
            pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
                let mut c = Config::default();
                $(
                    if let Some(v) = lookup($var) {
                        c.$field = <$ty as KnobValue>::parse_knob(&v).map_err(|why| {
                            Error::new(ErrorKind::Config { var: $var, value: v.clone(), why })
                        })?;
                    }
                )*
                c.check()?;
                Ok(c)
            }
        }
    };
}

knobs! {
    /// Algorithm for every call it implements: auto, ring, tree, rd, rhd, ring-ring, tree-ring.
    algo: Option<Algo> = None, "CCL_ALGO", "auto";
    /// Bytes per device slot of connections within a host (8 per connection and channel); device calls of a job on one host move pieces of 4 slots; auto: the GPU's memory / 8192, as a power of 2 from 1M to 8M (ranks whose GPUs differ get an error saying to set it).
    gpu_slot: Option<usize> = None, "CCL_GPU_SLOT", "auto";
    /// 1: every device call is finished by the communicator's proxy thread, as calls over tcp are (for checking that path on one host).
    gpu_proxy: bool = false, "CCL_GPU_PROXY", "0";
    /// Channels (independent rings or trees) each call is spread over (1-64); auto: 1 on one host, across hosts as many of 1, 2, 4, 8, 16 as the cost model predicts 10 % faster than fewer.
    nchannels: Option<usize> = None, "CCL_NCHANNELS", "auto";
    /// Bytes of slot memory per connection, split into 32 slots (2 where every connection of a group is TCP); auto: 2M where every rank of the machine has a core of its own and talks through memory, else 1M.
    buffsize: Option<usize> = None, "CCL_BUFFSIZE", "auto";
    /// Bytes per pipeline piece; 0 picks half a connection's slots (larger values are capped there, and smaller ones raised so that a call has at most 1024 pieces).
    chunksize: usize = 0, "CCL_CHUNKSIZE", "0";
    /// Seconds a call may wait for its peers before it fails.
    timeout: Duration = Duration::from_secs(300), "CCL_TIMEOUT", "300";
    /// What ccl prints to stderr: NONE, WARN, INFO (algorithm choices), TRACE.
    debug: LogLevel = LogLevel::Warn, "CCL_DEBUG", "WARN";
    /// default: every message's call is checked, and calls whose ranks disagree on the root or count are found when one waits on another (ranks compare their last calls), at the next call, or when the communicator is dropped; full: every collective first exchanges its call with every rank, so any disagreement fails the call itself on every rank.
    check: CheckMode = CheckMode::Default, "CCL_CHECK", "default";
    /// 1: ranks on one host talk over TCP instead of shared memory.
    shm_disable: bool = false, "CCL_SHM_DISABLE", "0";
    /// TCP sockets per connection; messages are spread over them in turn.
    sockets_per_peer: usize = 2, "CCL_SOCKETS_PER_PEER", "2";
    /// Network interfaces whose IPv4 addresses the TCP transport listens on, comma-separated: channel c's connections go to a peer's interface c modulo its count, so channels spread over them; an interface that is down is left out, said at INFO (empty: the one that reaches cclrun).
    socket_ifname: String = String::new(), "CCL_SOCKET_IFNAME", "";
    /// 1: no RDMA; ranks on other hosts talk over TCP.
    ib_disable: bool = false, "CCL_IB_DISABLE", "0";
    /// 1: RDMA through ccl's software verbs provider (over TCP), for tests; with CCL_SHM_DISABLE=1 it also connects ranks of one host.
    ib_soft: bool = false, "CCL_IB_SOFT", "0";
    /// RDMA ports to use (feature `rdma`), NCCL's syntax: a list of `device[:port]`, ^ to exclude those, = for exact names (empty: every device's first active port); channel c's connections use port c modulo their count.
    ib_hca: String = String::new(), "CCL_IB_HCA", "";
    /// GID index of RoCE ports (feature `rdma`); auto: the first RoCE v2 GID of an IPv4 address, else the first RoCE v2 one, else the first valid one.
    ib_gid_index: Option<usize> = None, "CCL_IB_GID_INDEX", "auto";
    /// Queue pairs per RDMA connection (1-16): its messages are dealt to them in turn.
    ib_qps_per_connection: usize = 1, "CCL_IB_QPS_PER_CONNECTION", "1";
    /// A fault the software RDMA provider injects, for tests: `rkey:R:N` (rank R's N-th write names a wrong rkey) or `error:R:N` (the queue pair of rank R's N-th write is forced to the error state); empty: none.
    ib_soft_fault: Option<SoftFault> = None, "CCL_IB_SOFT_FAULT", "";
    /// 1: a CRC32 of every TCP payload is sent and checked, so corruption on a link is an error.
    checksum: bool = false, "CCL_CHECKSUM", "0";
    /// Network bandwidth between hosts in Mbit/s for the cost model; 0 measures it at start-up.
    net_mbps: usize = 0, "CCL_NET_MBPS", "0";
    /// File of measured algorithm choices (bench/tuner --write), consulted before the cost model; the same on every rank.
    tune_file: String = String::new(), "CCL_TUNE_FILE", "";
    /// Outputs of at least this many bytes, out of place, are written with stores that bypass the cache (0: never); auto: half the last-level cache over the ranks of the machine that share it (16M where unknown).
    nt_stores_min: Option<usize> = None, "CCL_NT_STORES_MIN", "auto";
    /// How slots of memory connections are written: auto (calls of 256 KiB and more time both ways), cache (through it), around (streaming stores; steadier where ranks' cores share no cache).
    slot_stores: SlotStores = SlotStores::Auto, "CCL_SLOT_STORES", "auto";
}

impl Config {
    /// Defaults overridden by the process environment.
    pub fn from_env() -> Result<Self> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Bytes of slot memory per connection: `CCL_BUFFSIZE`, or where that
    /// is auto (and [`on_machine`](Self::on_machine) has not decided),
    /// [`BUFFSIZE`].
    pub fn buffsize(&self) -> usize {
        self.buffsize.unwrap_or(BUFFSIZE)
    }

    /// This configuration for a process that is one of `ranks` processes
    /// of the job on a machine giving them `cpus` CPUs, whose last-level
    /// cache is `cache` (unknown: `None`). Every rank of a machine decides
    /// the same.
    ///
    /// An auto `CCL_BUFFSIZE` becomes [`BUFFSIZE_OWN_CORES`] where each of
    /// several ranks has a CPU of its own and shared memory is enabled,
    /// else [`BUFFSIZE`] (a lone rank's connections are all TCP, whose
    /// slots keep their size).
    ///
    /// An auto `CCL_NT_STORES_MIN` becomes half an instance of the cache
    /// over the ranks that share it (the ranks spread evenly over the
    /// instances), at least [`NT_STORES_FLOOR`], or [`NT_STORES_MIN`] where
    /// the cache is unknown. Past that, the outputs of the ranks sharing
    /// the cache fill half of it, and writing them through it evicts the
    /// inputs and slots the next steps read (`bench/results/nt-stores.md`).
    pub fn on_machine(mut self, m: &crate::machine::Machine) -> Config {
        let (ranks, cpus, cache) = (m.ranks, m.cpus, m.llc);
        if self.buffsize.is_none() {
            let own = !self.shm_disable && ranks > 1 && ranks <= cpus;
            self.buffsize = Some(if own { BUFFSIZE_OWN_CORES } else { BUFFSIZE });
        }
        if self.nt_stores_min.is_none() {
            self.nt_stores_min = Some(cache.map_or(NT_STORES_MIN, |c| {
                let instances = (cpus / c.cpus.max(1)).max(1);
                let sharing = ranks.max(1).div_ceil(instances);
                (c.bytes / 2 / sharing).max(NT_STORES_FLOOR)
            }));
        }
        self
    }

    /// Outputs of at least this many bytes are written around the cache
    /// (0: none): `CCL_NT_STORES_MIN`, or where that is auto (and
    /// [`on_machine`](Self::on_machine) has not decided), [`NT_STORES_MIN`].
    pub fn nt_stores_min(&self) -> usize {
        self.nt_stores_min.unwrap_or(NT_STORES_MIN)
    }

    /// The interfaces `CCL_SOCKET_IFNAME` names, in order (none where it
    /// is empty).
    pub fn socket_ifnames(&self) -> Vec<&str> {
        self.socket_ifname.split(',').map(str::trim).filter(|n| !n.is_empty()).collect()
    }

    /// Bytes per slot of a connection in memory ([`NSLOTS`] of them).
    pub fn slot_bytes(&self) -> usize {
        (self.buffsize() / NSLOTS).max(64) / 64 * 64
    }

    /// Bytes per slot of a TCP connection ([`TCP_NSLOTS`] of them).
    pub fn tcp_slot_bytes(&self) -> usize {
        (self.buffsize() / TCP_NSLOTS).max(64) / 64 * 64
    }

    /// Slots per connection, and bytes per slot, of a group on `hosts`:
    /// TCP's where every connection is TCP (one rank per host, or shared
    /// memory disabled), else memory's (which the TCP connections of such a
    /// group then use too). Every rank of a group computes the same: this
    /// follows the rule by which the shared-memory transport takes a pair
    /// (enabled, same host), from what every rank knows, rather than asking
    /// this rank's transports, which see only its own peers.
    pub fn slots_on(&self, hosts: &crate::topo::Hosts) -> Geometry {
        if self.shm_disable || hosts.groups().iter().all(|g| g.len() <= 1) {
            Geometry { nslots: TCP_NSLOTS, slot_bytes: self.tcp_slot_bytes() }
        } else {
            Geometry { nslots: NSLOTS, slot_bytes: self.slot_bytes() }
        }
    }

    /// Slots per connection, and bytes per slot, that device calls of a
    /// group on `hosts` are cut by, on GPUs of `memory` bytes:
    /// [`gpu_slot_for`](Self::gpu_slot_for) within one host, where every
    /// connection hands over on the GPUs; else the host slots'
    /// ([`slots_on`](Self::slots_on)), which staged connections carry.
    pub fn device_slots_on(&self, hosts: &crate::topo::Hosts, memory: usize) -> Geometry {
        if self.shm_disable || hosts.groups().len() > 1 {
            self.slots_on(hosts)
        } else {
            Geometry { nslots: GPU_NSLOTS, slot_bytes: self.gpu_slot_for(memory) }
        }
    }

    /// Bytes per device slot on a GPU of `memory` bytes: `CCL_GPU_SLOT`,
    /// or where that is auto, the memory / 8192 as a power of 2 from 1 MiB
    /// to 8 MiB (80 GiB: 8 MiB; 16 GiB: 2 MiB): slots large enough that a
    /// slot's work outweighs its hand-off, few enough that the memory they
    /// take stays small beside the GPU's.
    pub fn gpu_slot_for(&self, memory: usize) -> usize {
        self.gpu_slot.unwrap_or_else(|| {
            let share = (memory >> 13).clamp(1 << 20, 8 << 20);
            1 << (usize::BITS - 1 - share.leading_zeros())
        })
    }

    fn check(&self) -> Result<()> {
        let bad = |var: &'static str, value: String, why: &str| {
            Err(Error::new(ErrorKind::Config { var, value, why: why.into() }))
        };
        if let Some(c) = self.nchannels.filter(|c| !(1..=64).contains(c)) {
            return bad("CCL_NCHANNELS", c.to_string(), "expected 1..=64, or auto");
        }
        if let Some(s) = self.gpu_slot.filter(|s| !s.is_multiple_of(64) || !(64..=1 << 30).contains(s)) {
            return bad("CCL_GPU_SLOT", s.to_string(), "expected a multiple of 64 bytes ..= 1 GiB, or auto");
        }
        if !(1..=16).contains(&self.ib_qps_per_connection) {
            return bad("CCL_IB_QPS_PER_CONNECTION", self.ib_qps_per_connection.to_string(), "expected 1..=16");
        }
        if self.sockets_per_peer == 0 || self.sockets_per_peer > 64 {
            return bad("CCL_SOCKETS_PER_PEER", self.sockets_per_peer.to_string(), "expected 1..=64");
        }
        if let Some(b) = self.buffsize.filter(|b| !(NSLOTS * 64..=1 << 30).contains(b)) {
            let want = format!("expected {} bytes ..= 1 GiB ({NSLOTS} slots of at least 64), or auto", NSLOTS * 64);
            return bad("CCL_BUFFSIZE", b.to_string(), &want);
        }
        Ok(())
    }
}

/// The text of `path`, a regular file of at most `limit` bytes: a device
/// (`/dev/zero`), a FIFO or a file larger than that is refused before
/// anything is read, and one that grows meanwhile is cut at the limit and
/// refused. For files named by users: hostfiles, tuning files.
pub fn read_bounded(path: &std::path::Path, limit: u64) -> std::result::Result<String, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let too_large = || format!("larger than {} KiB", limit >> 10);
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut text = String::new();
    f.take(limit + 1).read_to_string(&mut text).map_err(|e| e.to_string())?;
    if text.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_reads_refuse_devices_fifos_and_large_files() {
        let e = read_bounded(std::path::Path::new("/dev/zero"), 1 << 20).expect_err("a device");
        assert_eq!(e, "not a regular file");
        let dir = std::env::temp_dir().join(format!("ccl-read-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("f");
        std::fs::File::create(&f).expect("create").set_len(4097).expect("sparse");
        assert_eq!(read_bounded(&f, 4096).expect_err("too large"), "larger than 4 KiB");
        std::fs::write(&f, "all_reduce 2 1 8 ring\n").expect("write");
        assert_eq!(read_bounded(&f, 4096).expect("small"), "all_reduce 2 1 8 ring\n");
        assert!(read_bounded(&dir.join("none"), 4096).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
    use crate::machine::Machine;

    #[test]
    fn env_overrides_and_rejects() {
        let c = Config::from_lookup(|k| match k {
            "CCL_ALGO" => Some("Ring".into()),
            "CCL_BUFFSIZE" => Some("64K".into()),
            "CCL_TIMEOUT" => Some("2.5".into()),
            _ => None,
        })
        .expect("valid");
        assert_eq!(c.algo, Some(Algo::Ring));
        assert_eq!(c.slot_bytes(), (64 << 10) / NSLOTS);
        assert_eq!(
            c.clone().on_machine(&Machine { ranks: 2, cpus: 2, llc: None }).slot_bytes(),
            (64 << 10) / NSLOTS,
            "a value set is kept"
        );
        let auto = Config::from_lookup(|k| (k == "CCL_BUFFSIZE").then(|| "auto".into())).expect("auto");
        assert_eq!(auto.buffsize, None);
        assert!(Config::from_lookup(|k| (k == "CCL_BUFFSIZE").then(|| "lots".into())).is_err());
        assert_eq!(c.timeout, Duration::from_millis(2500));
        let e = Config::from_lookup(|k| (k == "CCL_ALGO").then(|| "bogus".into())).expect_err("bad algo");
        assert!(e.to_string().starts_with("CCL_ALGO=\"bogus\": unknown algorithm"), "{e}");
        assert!(Config::from_lookup(|k| (k == "CCL_NCHANNELS").then(|| "0".into())).is_err());
        let small = Config::from_lookup(|k| (k == "CCL_BUFFSIZE").then(|| "1K".into())).expect_err("too small");
        assert!(small.to_string().contains("expected 2048 bytes"), "{small}");
        assert!(Config::from_lookup(|k| (k == "CCL_TIMEOUT").then(|| "-1".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "CCL_TIMEOUT").then(|| "6488888888888888888888888".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "CCL_TIMEOUT").then(|| "NaN".into())).is_err());
    }

    #[test]
    fn soft_rdma_faults_name_their_kind_rank_and_write() {
        let at = |v: &str| Config::from_lookup(|k| (k == "CCL_IB_SOFT_FAULT").then(|| v.into()));
        let f = at("rkey:1:40").expect("valid").ib_soft_fault;
        assert_eq!(f, Some(SoftFault { kind: SoftFaultKind::Rkey, rank: 1, at: 40 }));
        let f = at(" Error:0:1 ").expect("valid").ib_soft_fault;
        assert_eq!(f, Some(SoftFault { kind: SoftFaultKind::Error, rank: 0, at: 1 }));
        assert_eq!(at("").expect("empty").ib_soft_fault, None);
        for bad in ["rkey", "rkey:1", "rkey:1:0", "flip:1:2", "rkey:x:2", "rkey:1:2:3"] {
            let e = at(bad).expect_err(bad);
            assert!(e.to_string().contains("expected rkey:RANK:N"), "{e}");
        }
    }

    #[test]
    fn groups_whose_connections_are_all_tcp_get_fewer_larger_slots() {
        use crate::topo::Hosts;
        let c = Config::default();
        let memory = Geometry { nslots: NSLOTS, slot_bytes: (1 << 20) / NSLOTS };
        let tcp = Geometry { nslots: TCP_NSLOTS, slot_bytes: (1 << 20) / TCP_NSLOTS };
        assert_eq!(c.slots_on(&Hosts::blocks(&[2, 2])), memory);
        assert_eq!(c.slots_on(&Hosts::blocks(&[2, 1])), memory, "one host with two ranks uses memory");
        assert_eq!(c.slots_on(&Hosts::blocks(&[1, 1, 1])), tcp);
        assert_eq!(Config { shm_disable: true, ..c.clone() }.slots_on(&Hosts::blocks(&[2, 2])), tcp);
        // the same memory per connection either way
        assert_eq!(memory.nslots * memory.slot_bytes, tcp.nslots * tcp.slot_bytes);
    }

    #[test]
    fn auto_streamed_outputs_start_at_half_the_last_level_cache_over_the_ranks_sharing_it() {
        use crate::machine::SharedCache;
        let c = Config::default();
        assert_eq!(c.nt_stores_min(), NT_STORES_MIN);
        let at =
            |c: &Config, ranks, cpus, cache| c.clone().on_machine(&Machine { ranks, cpus, llc: cache }).nt_stores_min();
        assert_eq!(at(&c, 2, 2, None), NT_STORES_MIN, "unknown cache");
        // this machine: 32 MiB shared by its 2 CPUs
        let here = Some(SharedCache { bytes: 32 << 20, cpus: 2 });
        assert_eq!(at(&c, 1, 2, here), 16 << 20);
        assert_eq!(at(&c, 2, 2, here), 8 << 20);
        assert_eq!(at(&c, 4, 2, here), 4 << 20);
        assert_eq!(at(&c, 64, 2, here), NT_STORES_FLOOR);
        assert_eq!(at(&c, 1000, 2, here), NT_STORES_FLOOR, "never below the floor");
        // 8 instances of 8 CPUs: ranks spread over them
        let split = Some(SharedCache { bytes: 32 << 20, cpus: 8 });
        assert_eq!(at(&c, 8, 64, split), 16 << 20);
        assert_eq!(at(&c, 9, 64, split), 8 << 20);
        assert_eq!(at(&c, 16, 64, split), 8 << 20);
        // a value set is kept, 0 (never) included, and decided once
        assert_eq!(at(&Config { nt_stores_min: Some(0), ..c.clone() }, 2, 2, here), 0);
        assert_eq!(at(&Config { nt_stores_min: Some(1 << 20), ..c.clone() }, 2, 2, here), 1 << 20);
        assert_eq!(at(&c.clone().on_machine(&Machine { ranks: 2, cpus: 2, llc: here }), 4, 2, here), 8 << 20);
    }

    #[test]
    fn auto_slot_memory_is_larger_only_where_every_rank_has_a_core_and_shared_memory() {
        let c = Config::default();
        assert_eq!(c.buffsize(), BUFFSIZE);
        let on = |c: &Config, ranks, cpus| c.clone().on_machine(&Machine { ranks, cpus, llc: None }).buffsize();
        assert_eq!(on(&c, 2, 2), BUFFSIZE_OWN_CORES);
        assert_eq!(on(&c, 8, 16), BUFFSIZE_OWN_CORES);
        assert_eq!(on(&c, 4, 2), BUFFSIZE, "ranks sharing cores");
        assert_eq!(on(&c, 1, 2), BUFFSIZE, "a lone rank's connections are TCP");
        assert_eq!(on(&Config { shm_disable: true, ..c.clone() }, 2, 2), BUFFSIZE, "TCP keeps its slots");
        // once decided, it stays decided
        let decided = c.clone().on_machine(&Machine { ranks: 2, cpus: 2, llc: None });
        assert_eq!(
            decided.clone().on_machine(&Machine { ranks: 4, cpus: 2, llc: None }).buffsize(),
            BUFFSIZE_OWN_CORES
        );
        let hosts = crate::topo::Hosts::blocks(&[2]);
        assert_eq!(decided.slots_on(&hosts).slot_bytes, BUFFSIZE_OWN_CORES / NSLOTS);
    }

    #[test]
    fn device_calls_are_cut_by_the_gpu_slots_only_within_one_host() {
        let c = Config::from_lookup(|k| (k == "CCL_GPU_SLOT").then(|| "256K".into())).expect("config");
        let one = crate::topo::Hosts::blocks(&[4]);
        assert_eq!(c.device_slots_on(&one, 80 << 30), Geometry { nslots: GPU_NSLOTS, slot_bytes: 256 << 10 });
        let two = crate::topo::Hosts::blocks(&[2, 2]);
        assert_eq!(c.device_slots_on(&two, 80 << 30), c.slots_on(&two), "staged connections carry host slots");
        let off = Config { shm_disable: true, ..c.clone() };
        assert_eq!(off.device_slots_on(&one, 80 << 30), off.slots_on(&one));
        let auto = Config::default();
        let gib = 1usize << 30;
        let sized: Vec<usize> = [4 * gib, 16 * gib, 24 * gib, 80 * gib, 141 * gib].map(|m| auto.gpu_slot_for(m)).into();
        assert_eq!(sized, [1 << 20, 2 << 20, 2 << 20, 8 << 20, 8 << 20]);
        for bad in ["100", "0", "2G"] {
            let e = Config::from_lookup(|k| (k == "CCL_GPU_SLOT").then(|| bad.into())).expect_err(bad);
            assert!(e.to_string().contains("CCL_GPU_SLOT"), "{e}");
        }
    }

    /// The README documents every knob with its default.
    #[test]
    fn readme_table_lists_every_knob() {
        let readme = include_str!("../../README.md");
        for k in KNOBS {
            let row = readme.lines().find(|l| l.starts_with(&format!("| `{}`", k.var)));
            let row = row.unwrap_or_else(|| panic!("README has no row for {}", k.var));
            assert!(row.contains(&format!("`{}`", k.default)), "README row for {} lacks default {}", k.var, k.default);
        }
    }
}
