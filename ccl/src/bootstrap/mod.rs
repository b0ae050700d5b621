//! Bootstrap: how a process learns its rank, the world size and its peers.
//!
//! Sources, in order: `cclrun`'s environment, then the rank variables of
//! mpirun or srun with a rendezvous address (see [`launch`]), or else a lone
//! process (a world of one), so `cargo run --example hello` just works.

pub mod auth;
pub mod hostid;
pub mod id;
pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod probe;
pub mod rendezvous;
pub mod wire;

pub use id::UniqueId;
pub use launch::LaunchEnv;
pub use rendezvous::{join, PeerInfo, Rendezvous};

use crate::comm::Group;
use crate::config::{Config, NSLOTS};
use crate::error::{Error, Result};
use crate::machine::Machine;
use crate::topo::Hosts;
use crate::transport::local::Fabric;
use crate::transport::shm::Shm;
use crate::transport::lost_notes;
use crate::transport::rdma::{self, Rdma};
use crate::transport::tcp::{interface_ipv4, Tcp};
use crate::transport::{Registry, Transport};
use std::sync::Arc;

/// Starts this process's world: from a launcher's environment if present,
/// else as a lone process.
pub fn init() -> Result<Group> {
    crate::comm::install_dump_on_sigusr1();
    crate::comm::exit::hook();
    let config = Config::from_env()?;
    let get = |k: &str| std::env::var(k).ok();
    #[cfg(feature = "mpi")]
    if launch::mpi_without_rendezvous(get) {
        let env = mpi::launch_env(&config)?;
        return start(&env, config);
    }
    match LaunchEnv::from_lookup(get)? {
        Some(env) => start(&env, config),
        None => lone(config),
    }
}

/// A world of one.
pub fn lone(config: Config) -> Result<Group> {
    let fabric = Fabric::new(1, NSLOTS, config.slot_bytes());
    let ep: Arc<dyn Transport> = Arc::new(fabric.endpoint(0));
    Group::new(0, Arc::from([0usize]), Hosts::flat(1), config, Arc::new(Registry::new(vec![ep])?), 0, Machine::here(1))
}

/// Joins the job `env` describes and connects the world.
pub fn start(env: &LaunchEnv, config: Config) -> Result<Group> {
    let job = env.id.job_tag();
    let files = env.id.files();
    let at = |e: Error| e.at_rank(env.rank);
    if env.serve_rendezvous {
        let rv = Rendezvous::bind_for(env.bind_addr(), env.id.clone(), env.size).map_err(at)?;
        let timeout = config.timeout;
        // its outcome reaches this rank through its own join below
        std::thread::spawn(move || rv.serve(timeout));
    }
    if env.launcher_pid.is_none() {
        // cclrun sweeps before its ranks start; under other launchers each
        // rank does, beside its start
        std::thread::spawn(Shm::sweep_stale);
    }
    let bell = Shm::create_bell(&files, env.rank).map_err(at)?;
    let info = config.debug >= crate::config::LogLevel::Info;
    let ips = tcp_ips(&config, &env.id, |why| {
        if info {
            eprintln!("ccl INFO rank {}: {why}", env.rank)
        }
    })
    .map_err(at)?;
    let listeners =
        ips.iter().map(|(n, ip)| Ok((n.clone(), Tcp::listen(*ip)?))).collect::<Result<Vec<_>>>().map_err(at)?;
    let addrs = listeners
        .iter()
        .map(|(n, l)| l.local_addr().map(|a| if n.is_empty() { a.to_string() } else { format!("{n}={a}") }))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::transport(format!("tcp listener: {e}")))
        .map_err(at)?;
    let dev = rdma::open(&config, &ips.iter().map(|&(_, ip)| ip).collect::<Vec<_>>(), env.rank);
    if let (Err(why), true) = (&dev, info) {
        eprintln!("ccl INFO rank {}: no RDMA ({why}): TCP between hosts", env.rank);
    }
    let me = PeerInfo {
        rank: env.rank,
        host: hostid::host_id(),
        pid: std::process::id(),
        addr: addrs.join(","),
        machine: hostid::machine_id(),
        rdma: dev.as_ref().ok().and_then(|d| d.first()).map_or("", |d| d.link_layer().tag()).into(),
    };
    let table = join(&env.id, &me, env.size, config.timeout).map_err(at)?;
    let hosts_ids: Vec<String> = table.iter().map(|p| p.host.clone()).collect();
    let pids: Vec<u32> = table.iter().map(|p| p.pid).collect();
    let peers = table.iter().map(listens_at).collect::<Result<Vec<_>>>().map_err(at)?;
    // hosts made with CCL_HOSTID may share one machine's cores
    let sharing = table.iter().filter(|p| p.machine == me.machine).count();
    let machine = Machine::here(sharing);
    let nt_set = config.nt_stores_min.is_some();
    let config = config.on_machine(&machine);
    let shm =
        Shm::new(&files, env.rank, bell, hosts_ids.clone(), pids, NSLOTS, config.slot_bytes(), !config.shm_disable);
    let hosts: Arc<[String]> = peers.iter().map(|a| a[0].1.ip().to_string()).collect();
    let tcp =
        Tcp::on_interfaces(env.rank, *env.id.secret(), listeners, peers, config.sockets_per_peer, config.checksum)
            .patience(config.timeout);
    let tcp = Arc::new(tcp);
    let mut list: Vec<Arc<dyn Transport>> = vec![Arc::new(shm)];
    if let Ok(dev) = dev {
        let ports = table.iter().map(|p| rdma::verbs::LinkLayer::from_tag(&p.rdma)).collect();
        let rdma = Rdma::new(env.rank, dev, Arc::clone(&tcp), hosts, ports, info).map_err(at)?;
        list.push(Arc::new(rdma.queue_pairs(config.ib_qps_per_connection)));
    }
    list.push(tcp);
    let registry = Registry::new(list)?
        .with_lost_notes(env.launcher_pid.map(|p| lost_notes::path(&files, p)))
        .with_files(files);
    let comm_id = u64::from_str_radix(&job, 16).unwrap_or(1);
    if config.debug >= crate::config::LogLevel::Info && env.rank == 0 {
        eprintln!("ccl INFO {} ranks started by {}, rendezvous {}", env.size, env.source, env.id);
        for p in &table {
            eprintln!("ccl INFO rank {} on {} (pid {})", p.rank, p.host, p.pid);
        }
        eprintln!("ccl INFO {}", streamed_outputs(&config, nt_set, &machine));
    }
    let info = config.debug >= crate::config::LogLevel::Info && env.rank == 0;
    let g = Group::new(
        env.rank,
        (0..env.size).collect(),
        Hosts::from_ids(&hosts_ids),
        config,
        Arc::new(registry),
        comm_id,
        machine,
    )?;
    if let Some((link, cores)) = probe::network(&g)? {
        if info {
            eprintln!("ccl INFO network between hosts: {link} (CCL_NET_MBPS=0 measures it)");
        }
        g.inner.tuner.set_model(crate::sim::Model::DEFAULT.with_inter(link).with_cores(cores));
    }
    Ok(g)
}

/// What `CCL_DEBUG=INFO` says of where outputs start to bypass the cache:
/// the threshold `config` holds, set by hand (`set`) or from the
/// last-level cache and the ranks of `machine`.
fn streamed_outputs(config: &Config, set: bool, machine: &Machine) -> String {
    let ranks = machine.ranks;
    let why = match (set, machine.llc) {
        (true, _) => "CCL_NT_STORES_MIN".to_string(),
        (false, Some(c)) => format!(
            "auto: last-level cache {} shared by {} CPU(s), {ranks} rank(s) on this machine",
            crate::tune::human(c.bytes),
            c.cpus
        ),
        (false, None) => "auto: last-level cache unknown".to_string(),
    };
    match config.nt_stores_min() {
        0 => format!("outputs are written through the cache ({why})"),
        nt => format!("outputs of {} and more are written around the cache ({why})", crate::tune::human(nt)),
    }
}

/// The addresses the TCP transport listens on, by interface name: the
/// IPv4 address of each interface `CCL_SOCKET_IFNAME` names that is up
/// (one that is down is left out, said to `info`; all down, or one without
/// an IPv4 address, is an error), or else the local address this host
/// uses to reach the rendezvous (found without sending anything), unnamed.
fn tcp_ips(config: &Config, id: &UniqueId, info: impl Fn(String)) -> Result<Vec<(String, std::net::IpAddr)>> {
    let names = config.socket_ifnames();
    if names.is_empty() {
        let ip = crate::transport::tcp::route_source(id.addr)
            .map_err(|e| Error::transport(format!("no route to the rendezvous at {}: {e}", id.addr)))?;
        return Ok(vec![(String::new(), ip)]);
    }
    let bad = |why: String| {
        Error::new(crate::ErrorKind::Config { var: "CCL_SOCKET_IFNAME", value: config.socket_ifname.clone(), why })
    };
    if names.len() > MAX_INTERFACES {
        return Err(bad(format!("{} interfaces: at most {MAX_INTERFACES}", names.len())));
    }
    let mut ips = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(bad(format!("{name} is named twice")));
        }
        match interface_ipv4(name) {
            None => return Err(bad(format!("no interface {name} with an IPv4 address"))),
            Some((ip, true)) => ips.push((name.to_string(), std::net::IpAddr::V4(ip))),
            Some((ip, false)) => info(format!("CCL_SOCKET_IFNAME: {name} ({ip}) is down: left out")),
        }
    }
    if ips.is_empty() {
        return Err(bad("every interface it names is down".into()));
    }
    Ok(ips)
}

/// Where rank `p` listens, one address per interface (`name=ip:port`,
/// or `ip:port` unnamed), as its entry in the rendezvous table says.
fn listens_at(p: &PeerInfo) -> Result<Vec<(String, std::net::SocketAddr)>> {
    let bad = || Error::transport(format!("rank {} sent address {:?}", p.rank, p.addr));
    let one = |a: &str| {
        let (name, at) = a.split_once('=').unwrap_or(("", a));
        Ok((name.to_string(), at.parse().map_err(|_| bad())?))
    };
    let addrs = p.addr.split(',').map(one).collect::<Result<Vec<_>>>()?;
    // (at most one per interface it could have named)
    if addrs.len() > MAX_INTERFACES {
        return Err(bad());
    }
    Ok(addrs)
}

/// Interfaces a rank may listen on.
const MAX_INTERFACES: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_interfaces_are_listed_in_order_and_bad_ones_named() {
        let id = UniqueId::new("127.0.0.1:9".parse().expect("addr"));
        let ips = |names: &str| {
            let config = Config { socket_ifname: names.into(), ..Config::default() };
            tcp_ips(&config, &id, |why| panic!("said {why}"))
        };
        let lo = ips(" lo ").expect("loopback");
        assert_eq!(lo, vec![("lo".to_string(), std::net::IpAddr::from([127, 0, 0, 1]))]);
        // unnamed, the address that reaches the rendezvous
        assert_eq!(ips("").expect("route"), vec![(String::new(), std::net::IpAddr::from([127, 0, 0, 1]))]);
        for (names, why) in [("lo,lo", "lo is named twice"), ("lo,nosuch9", "no interface nosuch9 with an IPv4 address")] {
            let e = ips(names).expect_err(names).to_string();
            assert!(e.contains("CCL_SOCKET_IFNAME") && e.contains(why), "{names}: {e}");
        }
    }

    #[test]
    fn a_rank_listens_at_one_address_per_interface_or_its_entry_is_refused() {
        let entry = |addr: &str| PeerInfo {
            rank: 3,
            host: "h".into(),
            pid: 1,
            addr: addr.into(),
            machine: "m".into(),
            rdma: String::new(),
        };
        let at = listens_at(&entry("eth0=10.0.0.1:5000,eth1=172.16.0.1:5001")).expect("two");
        assert_eq!(at[1], ("eth1".to_string(), "172.16.0.1:5001".parse().expect("addr")));
        assert_eq!(listens_at(&entry("10.0.0.1:5000")).expect("one")[0].0, "");
        let many = vec!["10.0.0.1:1"; MAX_INTERFACES + 1].join(",");
        for bad in ["", "eth0=", "10.0.0.1", "eth0=10.0.0.1:5000,,", many.as_str()] {
            let e = listens_at(&entry(bad)).expect_err(bad).to_string();
            assert!(e.contains("rank 3 sent address"), "{bad}: {e}");
        }
    }

    #[test]
    fn info_says_where_outputs_bypass_the_cache_and_why() {
        use crate::machine::SharedCache;
        let m = |ranks, llc| Machine { cpus: 2, ranks, llc };
        let here = Some(SharedCache { bytes: 32 << 20, cpus: 2 });
        let auto = Config::default().on_machine(&m(4, here));
        assert_eq!(
            streamed_outputs(&auto, false, &m(4, here)),
            "outputs of 4 MiB and more are written around the cache \
             (auto: last-level cache 32 MiB shared by 2 CPU(s), 4 rank(s) on this machine)"
        );
        let unknown = Config::default().on_machine(&m(2, None));
        assert_eq!(
            streamed_outputs(&unknown, false, &m(2, None)),
            "outputs of 16 MiB and more are written around the cache (auto: last-level cache unknown)"
        );
        // a threshold that is no whole number of MiB is not rounded
        let odd = Config::default().on_machine(&m(4, Some(SharedCache { bytes: 36 << 20, cpus: 2 })));
        assert!(streamed_outputs(&odd, false, &m(4, None)).starts_with("outputs of 4608 KiB and more"));
        let never = Config { nt_stores_min: Some(0), ..Config::default() };
        assert_eq!(
            streamed_outputs(&never, true, &m(2, here)),
            "outputs are written through the cache (CCL_NT_STORES_MIN)"
        );
    }

    #[test]
    fn a_lone_process_is_a_world_of_one() {
        let g = lone(Config::default()).expect("lone");
        assert_eq!((g.rank(), g.size()), (0, 1));
        let mut v = vec![2.0f32; 10];
        g.typed::<f32>().all_reduce(&mut v, crate::Sum).expect("all_reduce");
        assert_eq!(v, vec![2.0; 10]);
    }
}
