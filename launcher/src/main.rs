//! `cclrun`: launch an SPMD program as N ranks, mpirun-style.
//!
//! ```text
//! cclrun -np 4 ./app                       # 4 ranks on this host
//! cclrun -np 8 --hostfile hosts ./app      # ranks placed by the hostfile's slots
//! ```
//! cclrun hosts the rendezvous, starts the ranks with `CCL_*` in their
//! environment, forwards their output line by line, and when a rank fails
//! ends the others and exits with that rank's status.

mod job;

use cclrun::hostfile::{self, HostSlots};
use cclrun::place::{self, MapBy};
use clap::Parser;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// Allow more ranks than the hostfile has slots
    #[arg(long)]
    oversubscribe: bool,
    /// End the whole job after SECS seconds (exit code 124)
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
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
    let me = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default();
    matches!(name, "localhost" | "localhost.localdomain" | "127.0.0.1" | "::1" | "[::1]") || name == me
}

/// Finds `prog` like a shell would; the message says why not.
fn resolve(prog: &str) -> Result<PathBuf, String> {
    let executable =
        |p: &Path| p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    if prog.contains('/') {
        let p = PathBuf::from(prog);
        if !p.exists() {
            return Err(format!("{prog}: no such file"));
        }
        return if executable(&p) { Ok(p) } else { Err(format!("{prog}: not an executable file")) };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| executable(p))
        .ok_or_else(|| format!("{prog}: command not found"))
}

fn run() -> i32 {
    let args = std::env::args_os().map(|a| if a == "-np" { "--np".into() } else { a });
    let cli = Cli::parse_from(args);
    if cli.np == 0 {
        return fail("-np must be at least 1", 2);
    }
    let (hosts, oversubscribe) = match (&cli.hostfile, &cli.host) {
        (Some(f), _) => match std::fs::read_to_string(f) {
            Ok(text) => match hostfile::parse(&text, &f.display().to_string()) {
                Ok(h) => (h, cli.oversubscribe),
                Err(e) => return fail(e, 2),
            },
            Err(e) => return fail(format!("{}: {e}", f.display()), 2),
        },
        (None, Some(list)) => match hostfile::parse_list(list) {
            Ok(h) => (h, cli.oversubscribe),
            Err(e) => return fail(e, 2),
        },
        (None, None) => (vec![HostSlots { name: "localhost".into(), slots: cli.np, max_slots: None }], true),
    };
    if let Some(h) = hosts.iter().find(|h| !is_local(&h.name)) {
        return fail(format!("host {}: launching on other hosts (over SSH) is not supported yet", h.name), 2);
    }
    let host_of = match place::place(&hosts, cli.np, cli.map_by, oversubscribe) {
        Ok(p) => p,
        Err(e) => return fail(e, 2),
    };
    let prog = match resolve(&cli.command[0]) {
        Ok(p) => p,
        Err(e) => return fail(e, 127),
    };
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
    let spec = job::Spec {
        placement: place::locals(&host_of, hosts.len()),
        host_names: hosts.iter().map(|h| h.name.clone()).collect(),
        program: prog,
        args: cli.command[1..].to_vec(),
        env,
        tag_output: cli.tag_output,
        timeout: cli.timeout.filter(|t| *t > 0.0).map(Duration::from_secs_f64),
    };
    job::run(&spec)
}

fn main() {
    std::process::exit(run());
}
