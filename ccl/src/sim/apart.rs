//! Where the closed form ([`super::estimate`]) and the simulator
//! ([`super::simulate`]) disagree on a call: the model's terms they price
//! differently. Each term is taken away from both (a time set to nothing,
//! a rate so fast it costs nothing); those without which the two come
//! within 10 % of each other are named.

use super::{estimate, simulate, Call, Link, Model};
use crate::algo::Algo;
use crate::topo::Hosts;

/// The closed form's time for `call` by `algo` over the simulator's.
pub fn closed_over_simulated(call: &Call, algo: Algo, hosts: &Hosts, m: &Model) -> Result<f64, String> {
    Ok(estimate(call, algo, hosts, m)? / simulate(call, algo, hosts, m)?.seconds)
}

/// The terms of `m` without which the closed form's time for `call` by
/// `algo` comes within 10 % of the simulator's (none: no one term).
pub fn terms_apart(call: &Call, algo: Algo, hosts: &Hosts, m: &Model) -> Vec<&'static str> {
    let free = 1e18;
    let without = [
        ("latency inside a host", Model { intra: Link { latency: 0.0, ..m.intra }, ..*m }),
        ("network latency", Model { inter: Link { latency: 0.0, ..m.inter }, ..*m }),
        ("fetching from other cores", Model { intra: Link { bandwidth: free, ..m.intra }, first_slot: 0.0, ..*m }),
        ("network bytes", Model { inter: Link { bandwidth: free, ..m.inter }, bucket: None, ..*m }),
        ("copies", Model { copy: free, ..*m }),
        ("reductions", Model { reduce: free, ..*m }),
        ("per-step work", Model { step: 0.0, ..*m }),
        ("the cache", Model { cache: 0.0, ..*m }),
        ("waking on shared cores", Model { switch: 0.0, ..*m }),
    ];
    let agree = |w: &Model| closed_over_simulated(call, algo, hosts, w).is_ok_and(|r| (0.9..=1.1).contains(&r));
    without.into_iter().filter(|(_, w)| agree(w)).map(|(t, _)| t).collect()
}
