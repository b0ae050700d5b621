//! `cclrun --via mpirun|srun`: another launcher starts the processes.
//!
//! For clusters where SSH between nodes is not allowed. cclrun still hosts
//! the rendezvous; the ranks learn their rank from the launcher's own
//! variables (`OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`) and the
//! job from `CCL_UNIQUE_ID`, which travels in the environment, never on
//! the command line.

use cclrun::hostfile::HostSlots;
use cclrun::place::MapBy;
use std::path::Path;

/// The launcher to hand the processes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// Open MPI's or MPICH's mpirun.
    Mpirun,
    /// Slurm's srun, inside an allocation.
    Srun,
}

/// Where the ranks go, as the user gave it.
pub struct Where<'a> {
    /// Ranks.
    pub np: usize,
    /// `--hostfile`.
    pub hostfile: Option<&'a Path>,
    /// The hosts (from the hostfile or `-H`), if any were given.
    pub hosts: Option<&'a [HostSlots]>,
    /// `--map-by`.
    pub map_by: MapBy,
    /// `--oversubscribe`.
    pub oversubscribe: bool,
}

/// The command line that starts the job: launcher, its options, the
/// program and its arguments. `forward` names the variables the ranks need
/// from this environment.
pub fn command(via: Via, w: &Where, forward: &[String], program: &[String]) -> Vec<String> {
    let mut c: Vec<String> = Vec::new();
    match via {
        Via::Mpirun => {
            c.extend(["mpirun".into(), "-np".into(), w.np.to_string()]);
            match (w.hostfile, w.hosts) {
                (Some(f), _) => c.extend(["--hostfile".into(), f.display().to_string()]),
                (None, Some(h)) => c.extend(["-H".into(), list(h, ":")]),
                _ => {}
            }
            let by = if w.map_by == MapBy::Node { "node" } else { "slot" };
            c.extend(["--map-by".into(), by.into()]);
            if w.oversubscribe {
                c.push("--oversubscribe".into());
            }
            for v in forward {
                c.extend(["-x".into(), v.clone()]);
            }
        }
        Via::Srun => {
            c.extend(["srun".into(), "--ntasks".into(), w.np.to_string()]);
            let by = if w.map_by == MapBy::Node { "cyclic" } else { "block" };
            c.extend(["--distribution".into(), by.into()]);
            if let Some(h) = w.hosts {
                c.extend(["--nodelist".into(), h.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(",")]);
            }
            if w.oversubscribe {
                c.push("--overcommit".into());
            }
            c.push("--export".into());
            c.push(std::iter::once("ALL".to_string()).chain(forward.iter().cloned()).collect::<Vec<_>>().join(","));
        }
    }
    c.extend(program.iter().cloned());
    c
}

fn list(hosts: &[HostSlots], sep: &str) -> String {
    hosts.iter().map(|h| format!("{}{sep}{}", h.name, h.slots)).collect::<Vec<_>>().join(",")
}

/// `c` as one shell-safe line.
pub fn shell_line(c: &[String]) -> String {
    c.iter()
        .map(|a| {
            if !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b)) {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The address other hosts reach this one by: the source address of the
/// route toward `host` (found without sending anything), else loopback.
pub fn address_toward(host: Option<&str>) -> std::net::IpAddr {
    use std::net::ToSocketAddrs;
    let probe = |h: &str| -> Option<std::net::IpAddr> {
        let to = (cclrun::ssh::host_part(h), 9).to_socket_addrs().ok()?.find(|a| a.is_ipv4())?;
        ccl::launch::route_source(to).ok()
    };
    host.and_then(probe).unwrap_or([127, 0, 0, 1].into())
}

/// Runs `cmd` with `env` added, hosting the rendezvous for `np` ranks at
/// `ip`; the launcher's exit code. SIGINT and SIGTERM reach it (its own
/// handling ends the ranks).
pub fn run(cmd: &[String], env: &[(String, String)], np: usize, ip: std::net::IpAddr) -> i32 {
    let rv = match ccl::launch::Rendezvous::bind(std::net::SocketAddr::new(ip, 0), np) {
        Ok(rv) => rv,
        Err(e) => {
            eprintln!("cclrun: {e}");
            return 1;
        }
    };
    let id = rv.id().to_env_string();
    std::thread::spawn(move || rv.serve(std::time::Duration::from_secs(3600)));
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]).envs(env.iter().cloned()).env("CCL_UNIQUE_ID", id);
    // SAFETY: only prctl, async-signal-safe, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    match c.spawn().and_then(|mut c| c.wait()) {
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
        }
        Err(e) => {
            eprintln!("cclrun: cannot run {}: {e}", cmd[0]);
            127
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_placement_and_environment() {
        let hosts = vec![
            HostSlots { name: "a".into(), slots: 2, max_slots: None },
            HostSlots { name: "b".into(), slots: 2, max_slots: None },
        ];
        let w = Where { np: 4, hostfile: None, hosts: Some(&hosts), map_by: MapBy::Node, oversubscribe: false };
        let fwd = vec!["CCL_UNIQUE_ID".to_string(), "OMP_NUM_THREADS".into()];
        let prog = vec!["./app".to_string(), "--size".into(), "1 GB".into()];
        assert_eq!(
            shell_line(&command(Via::Mpirun, &w, &fwd, &prog)),
            "mpirun -np 4 -H a:2,b:2 --map-by node -x CCL_UNIQUE_ID -x OMP_NUM_THREADS ./app --size '1 GB'"
        );
        assert_eq!(
            shell_line(&command(Via::Srun, &w, &fwd, &prog)),
            "srun --ntasks 4 --distribution cyclic --nodelist a,b --export ALL,CCL_UNIQUE_ID,OMP_NUM_THREADS ./app \
             --size '1 GB'"
        );
        let f = Path::new("hosts");
        let w = Where { np: 2, hostfile: Some(f), hosts: Some(&hosts), map_by: MapBy::Slot, oversubscribe: true };
        assert_eq!(
            shell_line(&command(Via::Mpirun, &w, &[], &["x".into()])),
            "mpirun -np 2 --hostfile hosts --map-by slot --oversubscribe x"
        );
    }
}
