//! The parts of `cclrun`: hostfile parsing and placement (which the
//! fuzzers reuse too), starting a host's ranks, the agent that does so on
//! other hosts, its protocol, and the SSH side that reaches it.

#![deny(missing_docs)]

pub mod agent;
pub mod hostfile;
pub mod limits;
pub mod place;
pub mod proto;
pub mod spawn;
pub mod ssh;
