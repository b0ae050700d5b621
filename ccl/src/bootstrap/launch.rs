//! [`LaunchEnv`]: what the launcher told this process, read from the
//! environment.
//!
//! Sources, first match wins:
//! 1. `cclrun`: `CCL_RANK`, `CCL_WORLD_SIZE`, `CCL_LOCAL_RANK`,
//!    `CCL_LOCAL_SIZE`, `CCL_UNIQUE_ID` (and `CCL_LAUNCHER_PID`).
//! 2. Another launcher's rank variables: Open MPI (`OMPI_COMM_WORLD_*`),
//!    MPICH/Hydra (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`,
//!    `MPI_LOCALNRANKS`) or Slurm (`SLURM_PROCID`, `SLURM_NTASKS`,
//!    `SLURM_LOCALID`), with the rendezvous from `CCL_UNIQUE_ID` (set by
//!    `cclrun --via`) or from `CCL_ROOT=host:port` plus `CCL_SECRET` (rank 0
//!    listens there, like torchrun's `MASTER_ADDR`).
//!
//! `Ok(None)` means none applies: a lone process.

use super::id::UniqueId;
use crate::error::{Error, Result};
use std::net::{SocketAddr, ToSocketAddrs};

/// What the launcher told this process.
#[derive(Clone, Debug)]
pub struct LaunchEnv {
    /// World rank.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// The rendezvous and secret.
    pub id: UniqueId,
    /// This process hosts the rendezvous (rank 0 under `CCL_ROOT`).
    pub serve_rendezvous: bool,
    /// Which launcher's variables gave the rank: `cclrun`, `Open MPI`, ...
    pub source: &'static str,
    /// The process that started this rank, where cclrun says so
    /// (`CCL_LAUNCHER_PID`): where to look for the ranks it gave up on
    /// (see [`lost_notes`](crate::transport::lost_notes)).
    pub launcher_pid: Option<u32>,
}

/// Rank variables of launchers other than cclrun: name, rank, size, local
/// rank, local size.
const FOREIGN: [(&str, &str, &str); 3] = [
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MPICH", "PMI_RANK", "PMI_SIZE"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS"),
];

impl LaunchEnv {
    /// Reads the variables through `get`; `Ok(None)` when no launcher set
    /// any, or another launcher started a world of one without a rendezvous.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let num = |k: &str| -> Result<Option<usize>> {
            get(k)
                .map(|v| v.trim().parse().map_err(|_| Error::invalid(format!("{k}={v:?} is not a number"))))
                .transpose()
        };
        let (source, rank, size) = if let Some(rank) = num("CCL_RANK")? {
            let size =
                num("CCL_WORLD_SIZE")?.ok_or_else(|| Error::invalid("CCL_WORLD_SIZE is not set but CCL_RANK is"))?;
            ("cclrun", rank, size)
        } else {
            let Some(&(name, r, s)) = FOREIGN.iter().find(|f| get(f.1).is_some()) else { return Ok(None) };
            let rank = num(r)?.unwrap_or(0);
            let size = num(s)?.ok_or_else(|| Error::invalid(format!("{s} is not set but {r} is")))?;
            (name, rank, size)
        };
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!("rank {rank} is not below world size {size} ({source})")));
        }
        let (id, serve_rendezvous) = match (get("CCL_UNIQUE_ID"), get("CCL_ROOT")) {
            (Some(id), _) => (UniqueId::parse(&id)?, false),
            (None, Some(root)) if source != "cclrun" => {
                let secret = get("CCL_SECRET")
                    .ok_or_else(|| Error::invalid("CCL_ROOT is set but CCL_SECRET is not (32 hex digits)"))?;
                (UniqueId::from_parts(resolve_root(&root)?, &secret)?, rank == 0)
            }
            _ if source != "cclrun" && size == 1 => return Ok(None),
            _ => {
                return Err(Error::invalid(format!(
                    "started by {source} as rank {rank} of {size}, but no rendezvous is given: set CCL_ROOT=host:port \
                     and CCL_SECRET=<32 hex digits> for every rank, launch with `cclrun --via`, or build ccl with \
                     the `mpi` feature"
                )))
            }
        };
        let launcher_pid =
            if source == "cclrun" { get("CCL_LAUNCHER_PID").and_then(|v| v.trim().parse().ok()) } else { None };
        Ok(Some(LaunchEnv { rank, size, id, serve_rendezvous, source, launcher_pid }))
    }

    /// Where rank 0 listens when it hosts the rendezvous: every address,
    /// at `CCL_ROOT`'s port.
    pub fn bind_addr(&self) -> SocketAddr {
        let any: std::net::IpAddr =
            if self.id.addr.is_ipv4() { [0, 0, 0, 0].into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() };
        SocketAddr::new(any, self.id.addr.port())
    }
}

/// Started by mpirun or mpiexec (Open MPI or MPICH variables), with no
/// rendezvous from cclrun or `CCL_ROOT`: the case MPI bootstraps.
#[cfg(any(feature = "mpi", test))]
pub fn mpi_without_rendezvous(get: impl Fn(&str) -> Option<String>) -> bool {
    let ccl = ["CCL_RANK", "CCL_UNIQUE_ID", "CCL_ROOT"].iter().any(|k| get(k).is_some());
    !ccl && FOREIGN[..2].iter().any(|f| get(f.1).is_some())
}

/// `CCL_ROOT`: `host:port`, the host a name or an address (IPv4 preferred).
fn resolve_root(root: &str) -> Result<SocketAddr> {
    let bad = |why: String| Error::invalid(format!("CCL_ROOT={root:?}: {why} (expected host:port)"));
    let addrs: Vec<SocketAddr> = root.trim().to_socket_addrs().map_err(|e| bad(e.to_string()))?.collect();
    let pick = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).ok_or_else(|| bad("no address".into()))?;
    if pick.port() == 0 {
        return Err(bad("port 0".into()));
    }
    Ok(*pick)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&'static str, String)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn cclrun_variables_are_parsed_and_checked() {
        let id = UniqueId::new("127.0.0.1:9".parse().expect("addr")).to_env_string();
        let env = |rank: &str, size: &str| {
            vec![("CCL_RANK", rank.to_string()), ("CCL_WORLD_SIZE", size.to_string()), ("CCL_UNIQUE_ID", id.clone())]
        };
        let e = LaunchEnv::from_lookup(lookup(&env("1", "4"))).expect("ok").expect("some");
        assert_eq!((e.rank, e.size, e.source), (1, 4, "cclrun"));
        assert!(!e.serve_rendezvous);
        assert!(LaunchEnv::from_lookup(lookup(&env("4", "4"))).is_err());
        assert!(LaunchEnv::from_lookup(lookup(&env("x", "4"))).is_err());
        assert!(LaunchEnv::from_lookup(|_| None).expect("ok").is_none());
    }

    #[test]
    fn other_launchers_with_ccl_root() {
        let secret = "00112233445566778899aabbccddeeff".to_string();
        let vars = vec![
            ("OMPI_COMM_WORLD_RANK", "0".to_string()),
            ("OMPI_COMM_WORLD_SIZE", "3".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3".into()),
            ("CCL_ROOT", "127.0.0.1:29500".into()),
            ("CCL_SECRET", secret.clone()),
        ];
        let e = LaunchEnv::from_lookup(lookup(&vars)).expect("ok").expect("some");
        assert_eq!((e.rank, e.size, e.source, e.serve_rendezvous), (0, 3, "Open MPI", true));
        assert_eq!(e.bind_addr().to_string(), "0.0.0.0:29500");
        let slurm = vec![
            ("SLURM_PROCID", "5".to_string()),
            ("SLURM_NTASKS", "8".into()),
            ("SLURM_LOCALID", "1".into()),
            ("SLURM_NTASKS_PER_NODE", "2(x4)".into()),
            ("CCL_ROOT", "localhost:29500".into()),
            ("CCL_SECRET", secret.clone()),
        ];
        let e = LaunchEnv::from_lookup(lookup(&slurm)).expect("ok").expect("some");
        assert_eq!((e.rank, e.size, e.serve_rendezvous), (5, 8, false));
        // cclrun --via: the id is given, nobody else serves
        let via = vec![
            ("PMI_RANK", "0".to_string()),
            ("PMI_SIZE", "2".into()),
            ("CCL_UNIQUE_ID", UniqueId::new("10.0.0.1:7".parse().expect("addr")).to_env_string()),
        ];
        let e = LaunchEnv::from_lookup(lookup(&via)).expect("ok").expect("some");
        assert_eq!((e.source, e.serve_rendezvous), ("MPICH", false));
    }

    #[test]
    fn other_launchers_without_a_rendezvous() {
        let one = vec![("OMPI_COMM_WORLD_RANK", "0".to_string()), ("OMPI_COMM_WORLD_SIZE", "1".into())];
        assert!(LaunchEnv::from_lookup(lookup(&one)).expect("ok").is_none());
        let two = vec![("SLURM_PROCID", "1".to_string()), ("SLURM_NTASKS", "2".into())];
        let msg = LaunchEnv::from_lookup(lookup(&two)).expect_err("no root").to_string();
        assert!(msg.contains("CCL_ROOT") && msg.contains("Slurm"), "{msg}");
        let bad = |k: &'static str, v: &str| {
            let mut v2 = two.clone();
            v2.push(("CCL_ROOT", "127.0.0.1:1".into()));
            v2.push(("CCL_SECRET", "00112233445566778899aabbccddeeff".into()));
            v2.retain(|(n, _)| *n != k);
            v2.push((k, v.to_string()));
            LaunchEnv::from_lookup(lookup(&v2)).expect_err(k).to_string()
        };
        assert!(bad("CCL_SECRET", "abc").contains("CCL_SECRET"));
        assert!(bad("CCL_ROOT", "nohostport").contains("CCL_ROOT"));
        assert!(bad("CCL_ROOT", "127.0.0.1:0").contains("port 0"));
        assert!(bad("SLURM_PROCID", "2").contains("not below"));
    }
}
