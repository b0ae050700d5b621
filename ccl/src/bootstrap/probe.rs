//! Measuring the network between hosts at start-up, for the cost model.
//!
//! The first ranks of the first two hosts time a few one-byte round trips
//! (latency: half the best) and a few 4 MiB transfers, each answered by a
//! byte (bandwidth: the best). The first of them then broadcasts the
//! figures, with its host's core count, so every rank's tuner predicts with
//! the same model and makes the same choices.
//! About 0.1 s on a 1 Gbit/s link; only jobs on several hosts pay it.

use crate::comm::Group;
use crate::error::Result;
use crate::sim::{Link, Model};
use std::time::Instant;

/// Bytes of each bandwidth transfer.
const BULK: usize = 4 << 20;
/// Round trips timed (after two that set up the connections).
const TRIPS: usize = 8;
/// Bulk transfers timed.
const BULKS: usize = 3;

/// The network link between hosts, measured (`CCL_NET_MBPS=0`) or as
/// configured, and the cores per host to assume; `None` on one host. Every
/// rank of `g` must call it.
pub fn network(g: &Group) -> Result<Option<(Link, usize)>> {
    let groups = g.hosts().groups();
    if groups.len() < 2 {
        return Ok(None);
    }
    let (a, b) = (groups[0][0], groups[1][0]);
    let me = g.rank();
    let cores = g.machine().cpus;
    let mbps = g.inner.config.net_mbps;
    if mbps > 0 {
        let mut c = [cores as u64];
        g.typed::<u64>().broadcast(&mut c, a)?;
        let link = Link { latency: Model::DEFAULT.inter.latency, bandwidth: mbps as f64 * 1e6 / 8.0 };
        return Ok(Some((link, c[0] as usize)));
    }
    let c = g.typed::<u8>();
    let mut fig = [0f64; 3];
    if me == a || me == b {
        let peer = if me == a { b } else { a };
        let mut one = [0u8];
        let mut rtt = f64::INFINITY;
        for i in 0..TRIPS + 2 {
            let t = Instant::now();
            if me == a {
                c.send(&one, peer)?;
                c.recv(&mut one, peer)?;
            } else {
                c.recv(&mut one, peer)?;
                c.send(&one, peer)?;
            }
            if i >= 2 {
                rtt = rtt.min(t.elapsed().as_secs_f64());
            }
        }
        let mut bulk = vec![0u8; BULK];
        let mut bw = 0f64;
        for _ in 0..BULKS {
            let t = Instant::now();
            if me == a {
                c.send(&bulk, peer)?;
                c.recv(&mut one, peer)?;
            } else {
                c.recv(&mut bulk, peer)?;
                c.send(&one, peer)?;
            }
            let secs = (t.elapsed().as_secs_f64() - rtt).max(1e-9);
            bw = bw.max(BULK as f64 / secs);
        }
        fig = [rtt / 2.0, bw, cores as f64];
    }
    g.typed::<f64>().broadcast(&mut fig, a)?;
    Ok(Some((Link { latency: fig[0], bandwidth: fig[1] }, fig[2] as usize)))
}
