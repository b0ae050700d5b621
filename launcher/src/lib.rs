//! The parts of `cclrun` that other tools (and the fuzzers) reuse:
//! hostfile parsing and placement.

#![deny(missing_docs)]

pub mod hostfile;
pub mod place;
