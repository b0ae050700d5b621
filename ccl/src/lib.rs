//! ccl: collective communication for SPMD programs.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate self as ccl;

pub mod algo;
mod error;
mod op;
mod reduce;
pub mod topo;

pub use ccl_macros::Reduce;
pub use error::{Context, Error, ErrorKind, Result};
pub use op::{Avg, BitAnd, BitOr, BitXor, Max, Min, Op, Prod, ReduceOp, Sum};
pub use reduce::Reduce;
