//! How a schedule uses a communicator's connections: worked out once per
//! plan by its first call, then shared by every later call of it.

use super::Conns;
use crate::algo::lend::Lending;
use crate::algo::Schedule;
use crate::error::Result;
use std::sync::Arc;

/// Connection indices a step uses: (send, recv).
pub(super) type Link = (Option<usize>, Option<usize>);

/// A schedule's connections on one communicator: found (and made) by the
/// first call of a plan, then shared by every later call of it.
#[derive(Debug)]
pub(super) struct Wiring {
    /// The schedule wired.
    pub(super) sched: Arc<Schedule>,
    /// Per channel, per step: the connections it sends and receives on.
    pub(super) links: Vec<Vec<Link>>,
    /// Every connection used, by [`Conns::send_id`]/[`Conns::recv_id`],
    /// sorted, once each.
    pub(super) uses: Vec<usize>,
    /// How its steps share the call's memory with sockets.
    pub(super) lending: Lending,
}

impl Wiring {
    /// Finds (and makes) the connections of `sched`'s steps, its channels
    /// mapped from `channel_base` on, sharing memory with sockets as `lending` says.
    pub(super) fn new(sched: &Arc<Schedule>, lending: Lending, channel_base: u32, conns: &mut Conns) -> Result<Self> {
        let mut links = Vec::with_capacity(sched.channels.len());
        for (c, ch) in sched.channels.iter().enumerate() {
            let channel = channel_base + c as u32;
            let mut l = Vec::with_capacity(ch.len());
            for st in ch {
                let s = st.send_peer().map(|p| conns.send(p, channel)).transpose()?;
                let r = st.recv_peer().map(|p| conns.recv(p, channel)).transpose()?;
                l.push((s, r));
            }
            links.push(l);
        }
        let mut uses: Vec<usize> = links
            .iter()
            .flatten()
            .flat_map(|&(s, r)| [s.map(|i| conns.send_id(i)), r.map(|i| conns.recv_id(i))])
            .flatten()
            .collect();
        uses.sort_unstable();
        uses.dedup();
        Ok(Wiring { sched: Arc::clone(sched), links, uses, lending })
    }
}

