//! `cclrun`: launch an SPMD program as N ranks, mpirun-style.
//!
//! ```text
//! cclrun -np 4 ./app                       # 4 ranks on this host
//! cclrun -np 8 --hostfile hosts ./app      # ranks placed by the hostfile's slots, over SSH
//! cclrun -np 8 --hostfile hosts --via mpirun ./app   # mpirun starts the processes
//! ```
//! cclrun hosts the rendezvous, starts the ranks with `CCL_*` in their
//! environment (on other hosts through `cclrun agent` over SSH), forwards
//! their output line by line, and when a rank fails ends the others and
//! exits with that rank's status.

mod hosts;
mod job;
mod spec;
mod via;

use cclrun::hostfile::{self, HostSlots};
use cclrun::limits;
use cclrun::place::{self, MapBy};
use cclrun::ssh::SshOpts;
use clap::Parser;
use std::path::PathBuf;
use via::Via;

/// Launch an SPMD program as N ranks (mpirun-style).
#[derive(Parser, Debug)]
#[command(name = "cclrun", version, after_help = "Without --hostfile or -H, every rank runs on this host.")]
struct Cli {
    /// Number of ranks to start (also -np N)
    #[arg(short = 'n', long = "np", value_name = "N")]
    np: usize,
    /// Hosts and slots, one per line: `host slots=N [max_slots=M]` or `host:N`
    #[arg(long, value_name = "FILE", conflicts_with = "host")]
    hostfile: Option<PathBuf>,
    /// Hosts and slots inline: `host[:slots],host[:slots],...`
    #[arg(short = 'H', long = "host", value_name = "LIST")]
    host: Option<String>,
    /// Fill each host's slots in turn (slot) or deal ranks round robin (node)
    #[arg(long = "map-by", value_enum, default_value = "slot")]
    map_by: MapBy,
    /// Pass VAR from this environment, or set VAR=VALUE, for every rank
    #[arg(short = 'x', value_name = "VAR[=VALUE]")]
    export: Vec<String>,
    /// Prefix every output line with the rank that wrote it: `[3] ...`
    #[arg(long)]
    tag_output: bool,
    /// Allow more ranks than the hostfile has slots (without a hostfile:
    /// more than 64 per CPU)
    #[arg(long)]
    oversubscribe: bool,
    /// Pin each rank to one CPU of those cclrun may use on its host, in
    /// local-rank order (with more ranks than CPUs, neighbouring ranks share
    /// one: contiguous blocks), as mpirun's `--bind-to core`; `none` leaves
    /// placement to the kernel; `auto` pins as `core` on hosts with more of
    /// the job's ranks than CPUs, a multiple of them (where the kernel's
    /// placement varies from run to run), and as `none` elsewhere (jobs side
    /// by side on one machine would otherwise share the same first CPUs)
    #[arg(long = "bind-to", value_enum, default_value = "auto")]
    bind_to: cclrun::proto::Bind,
    /// End the whole job after SECS seconds (exit code 124)
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Private key for SSH (default: the ssh agent, then ~/.ssh/id_{ed25519,ecdsa,rsa})
    #[arg(long, value_name = "FILE")]
    ssh_key: Option<PathBuf>,
    /// sshd's port on every host
    #[arg(long, value_name = "PORT", default_value_t = 22)]
    ssh_port: u16,
    /// Host keys to trust [default: ~/.ssh/known_hosts]
    #[arg(long, value_name = "FILE")]
    known_hosts: Option<PathBuf>,
    /// Trust and record the keys of hosts not in known_hosts (a changed key is always refused)
    #[arg(long)]
    accept_new_host_keys: bool,
    /// Path of cclrun on the other hosts [default: this cclrun's path]
    #[arg(long, value_name = "PATH")]
    remote_cclrun: Option<String>,
    /// Let another launcher start the processes (no SSH from cclrun)
    #[arg(long, value_enum, value_name = "LAUNCHER")]
    via: Option<Via>,
    /// Print what would run where, and start nothing
    #[arg(long)]
    dry_run: bool,
    /// The program to run, and its arguments
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

fn fail(msg: impl std::fmt::Display, code: i32) -> i32 {
    eprintln!("cclrun: {msg}");
    code
}

/// Names under which this host appears in a hostfile.
fn is_local(name: &str) -> bool {
    matches!(name, "localhost" | "localhost.localdomain" | "127.0.0.1" | "::1" | "[::1]") || name == this_host()
}

/// This machine's hostname, read once.
fn this_host() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
    })
}

/// `first-last` for consecutive ranks, else a list.
fn ranks_text(r: &[usize]) -> String {
    match r {
        [] => "no ranks".into(),
        [one] => format!("rank {one}"),
        [a, .., b] if b - a + 1 == r.len() => format!("ranks {a}-{b}"),
        _ => format!("ranks {}", r.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")),
    }
}

fn run() -> i32 {
    let args = std::env::args_os().map(|a| if a == "-np" { "--np".into() } else { a });
    let cli = Cli::parse_from(args);
    let local_only = cli.hostfile.is_none() && cli.host.is_none();
    if cli.np == 0 {
        return fail("-np must be at least 1", 2);
    }
    if cli.np > limits::MAX_RANKS {
        return fail(format!("-np {}: a job has at most {} ranks", cli.np, limits::MAX_RANKS), 2);
    }
    if local_only {
        if let Err(e) = limits::check_np(cli.np, cli.oversubscribe) {
            return fail(e, 2);
        }
    }
    let timeout = match cli.timeout.map(limits::timeout).transpose() {
        Ok(t) => t,
        Err(e) => return fail(e, 2),
    };
    let (hosts, oversubscribe) = match (&cli.hostfile, &cli.host) {
        (Some(f), _) => match hostfile::read(f) {
            Ok(h) => (h, cli.oversubscribe),
            Err(e) => return fail(e, 2),
        },
        (None, Some(list)) => match hostfile::parse_list(list) {
            Ok(h) => (h, cli.oversubscribe),
            Err(e) => return fail(e, 2),
        },
        (None, None) => (vec![HostSlots { name: "localhost".into(), slots: cli.np, max_slots: None }], true),
    };
    let host_of = match place::place(&hosts, cli.np, cli.map_by, oversubscribe) {
        Ok(p) => p,
        Err(e) => return fail(e, 2),
    };
    // however they were placed (-H, a hostfile), the ranks this host starts
    let local: Vec<bool> = hosts.iter().map(|h| is_local(&h.name)).collect();
    let here = host_of.iter().filter(|&&h| local[h]).count();
    if let Err(e) = limits::check_np(here, cli.oversubscribe) {
        return fail(e, 2);
    }
    let mut env = Vec::new();
    for x in &cli.export {
        match x.split_once('=') {
            Some((k, v)) => env.push((k.to_string(), v.to_string())),
            None => match std::env::var(x) {
                Ok(v) => env.push((x.clone(), v)),
                Err(_) => return fail(format!("-x {x}: not set in this environment"), 2),
            },
        }
    }
    if let Some(v) = cli.via {
        return run_via(&cli, v, &hosts, local_only, env);
    }
    let mut ssh = SshOpts::from_env();
    ssh.port = cli.ssh_port;
    ssh.key = cli.ssh_key.clone();
    ssh.accept_new = cli.accept_new_host_keys;
    if let Some(k) = &cli.known_hosts {
        ssh.known_hosts = k.clone();
    }
    let this = std::env::current_exe().map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| "cclrun".into());
    let spec = spec::Spec {
        placement: place::locals(&host_of, hosts.len()),
        host_names: hosts.iter().map(|h| h.name.clone()).collect(),
        local,
        program: cli.command[0].clone(),
        args: cli.command[1..].to_vec(),
        env,
        tag_output: cli.tag_output,
        bind: cli.bind_to,
        timeout,
        ssh,
        remote_cclrun: cli.remote_cclrun.clone().unwrap_or(this),
    };
    if cli.dry_run {
        for (h, name) in spec.host_names.iter().enumerate() {
            let r: Vec<usize> = (0..cli.np).filter(|&r| spec.placement[r].host == h).collect();
            let how = if spec.local[h] {
                "started here".to_string()
            } else {
                let user = if name.contains('@') { String::new() } else { format!("{}@", spec.ssh.user) };
                format!("ssh {user}{name} port {}, `{} agent`", spec.ssh.port, spec.remote_cclrun)
            };
            println!("{name}: {} ({how})", ranks_text(&r));
        }
        return 0;
    }
    job::run(&spec)
}

/// `--via`: the other launcher's command line, run or (`--dry-run`) shown.
fn run_via(cli: &Cli, v: Via, hosts: &[HostSlots], local_only: bool, env: Vec<(String, String)>) -> i32 {
    let w = via::Where {
        np: cli.np,
        hostfile: cli.hostfile.as_deref(),
        hosts: (!local_only).then_some(hosts),
        map_by: cli.map_by,
        oversubscribe: cli.oversubscribe,
    };
    let mut forward: Vec<String> = vec!["CCL_UNIQUE_ID".into()];
    forward.extend(std::env::vars().map(|(k, _)| k).filter(|k| k.starts_with("CCL_") && k != "CCL_UNIQUE_ID"));
    forward.extend(env.iter().map(|(k, _)| k.clone()));
    forward.dedup();
    let cmd = via::command(v, &w, &forward, &cli.command);
    if cli.dry_run {
        println!("CCL_UNIQUE_ID=<set by cclrun> {}", via::shell_line(&cmd));
        return 0;
    }
    let ip = via::address_toward(hosts.iter().map(|h| h.name.as_str()).find(|h| !is_local(h)));
    via::run(&cmd, &env, cli.np, ip)
}

fn main() {
    if std::env::args_os().nth(1).is_some_and(|a| a == "agent") {
        std::process::exit(cclrun::agent::main());
    }
    std::process::exit(run());
}
