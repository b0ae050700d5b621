//! Choosing the algorithm, channels and piece size of a call.
//!
//! For now a rule per collective and size class; the cost model that
//! predicts each schedule's time comes with the performance work. Forced
//! choices (`CCL_ALGO`, `CCL_NCHANNELS`, `CCL_CHUNKSIZE`) win where they
//! apply. The piece size never exceeds half a connection's slots, the
//! condition under which the verifier proves every schedule deadlock-free.

use crate::algo::{Algo, Coll};
use crate::config::{Config, LogLevel, NSLOTS};
use crate::topo::Hosts;

/// What a call will run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The algorithm.
    pub algo: Algo,
    /// Channels.
    pub channels: usize,
    /// Elements per pipeline piece.
    pub chunk: usize,
    /// Elements per slot.
    pub slot_elems: usize,
}

/// Calls at or below this many bytes are latency-bound.
const SMALL: usize = 16 << 10;

/// The choice for `coll` moving `bytes` (per rank) of `elem_size`-byte elements.
pub fn choose(coll: Coll, bytes: usize, elem_size: usize, hosts: &Hosts, cfg: &Config) -> Choice {
    let n = hosts.nranks();
    let multi_host = hosts.groups().len() > 1;
    let forced = cfg.algo.filter(|a| coll.algos().contains(a));
    let algo = forced.unwrap_or_else(|| match coll {
        Coll::AllReduce if bytes <= SMALL && n > 2 => Algo::RecursiveDoubling,
        Coll::AllReduce if multi_host => Algo::RingRing,
        Coll::AllGather if bytes <= SMALL => Algo::RecursiveDoubling,
        Coll::ReduceScatter if bytes <= SMALL => Algo::HalvingDoubling,
        Coll::Broadcast | Coll::Reduce if bytes <= SMALL => Algo::Tree,
        _ => coll.algos()[0],
    });
    let slot_elems = (cfg.slot_bytes() / elem_size.max(1)).max(1);
    let max_chunk = slot_elems * NSLOTS / 2;
    let chunk = match cfg.chunksize {
        0 => max_chunk,
        b => (b / elem_size.max(1)).clamp(1, max_chunk),
    };
    let choice = Choice { algo, channels: cfg.nchannels, chunk, slot_elems };
    if cfg.debug >= LogLevel::Info {
        let why = if forced.is_some() { "forced by CCL_ALGO" } else { "size rule" };
        eprintln!(
            "ccl INFO {coll} {bytes} B on {n} ranks / {} hosts: {algo} ({why}), {} channel(s), pieces of {chunk} elements",
            hosts.groups().len(),
            choice.channels
        );
    }
    choice
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_algorithms_apply_only_where_they_fit() {
        let cfg = Config { algo: Some(Algo::Tree), ..Config::default() };
        let h = Hosts::flat(4);
        assert_eq!(choose(Coll::AllReduce, 1 << 20, 4, &h, &cfg).algo, Algo::Tree);
        assert_eq!(choose(Coll::AllGather, 1 << 20, 4, &h, &cfg).algo, Algo::Ring);
        let c = choose(Coll::AllReduce, 1 << 20, 4, &h, &Config { chunksize: 1 << 30, ..Config::default() });
        assert_eq!(c.chunk, c.slot_elems * NSLOTS / 2);
    }
}
