//! Bootstrap through MPI (cargo feature `mpi`, rsmpi): for programs started
//! by `mpirun` or `mpiexec` without `CCL_ROOT`. Rank 0 opens the rendezvous
//! and makes the [`UniqueId`]; one `MPI_Bcast` hands it to every rank, and
//! MPI is used for nothing else. If this call initialised MPI it also
//! finalises it; a program that initialised MPI itself keeps it.

use super::id::UniqueId;
use super::launch::LaunchEnv;
use super::rendezvous::Rendezvous;
use crate::config::Config;
use crate::error::{Error, Result};
use mpi::traits::{Communicator, Root};

/// Room for the id's text form in the broadcast.
const ID_BYTES: usize = 128;

/// The address rank 0 offers: `CCL_SOCKET_IFNAME`'s, else the one of the
/// default route (found without sending anything), else loopback.
fn offer_ip(config: &Config) -> std::net::IpAddr {
    let first = config.socket_ifnames().first().and_then(|n| crate::transport::tcp::interface_ipv4(n));
    if let Some((ip, _)) = first {
        return ip.into();
    }
    // TEST-NET-1: only the route is looked up
    crate::transport::tcp::route_source(([192, 0, 2, 1], 9).into()).unwrap_or([127, 0, 0, 1].into())
}

/// This process's place in the world, from MPI; rank 0 starts serving the
/// rendezvous before the id goes out.
pub fn launch_env(config: &Config) -> Result<LaunchEnv> {
    let universe = mpi::initialize();
    let world = mpi::topology::SimpleCommunicator::world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let mut buf = [0u8; ID_BYTES];
    let mut served = None;
    if rank == 0 {
        let rv = Rendezvous::bind(std::net::SocketAddr::new(offer_ip(config), 0), size)?;
        let text = rv.id().to_env_string();
        let room = buf.get_mut(..text.len()).ok_or_else(|| Error::internal("id longer than its broadcast"))?;
        room.copy_from_slice(text.as_bytes());
        served = Some(rv);
    }
    world.process_at_rank(0).broadcast_into(&mut buf[..]);
    drop(universe); // finalises MPI if this call initialised it
    if let Some(rv) = served {
        let timeout = config.timeout;
        std::thread::spawn(move || rv.serve(timeout));
    }
    let text = std::str::from_utf8(&buf).map_err(|_| Error::invalid("MPI broadcast a garbled id"))?;
    let id = UniqueId::parse(text.trim_end_matches('\0'))?;
    Ok(LaunchEnv {
        rank,
        size,
        id,
        serve_rendezvous: false,
        source: "MPI",
        launcher_pid: None,
    })
}
