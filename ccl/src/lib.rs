//! ccl: collective communication for SPMD programs.
//!
//! A [`Group`] is a set of ranks that communicate; `group.typed::<T>()`
//! gives the typed [`Communicator<T>`] whose collectives only compile for
//! element types and operators that fit ([`Reduce`], [`ReduceOp`]).
//! [`init()`] starts the world of a process launched by `cclrun` (or a world
//! of one); [`testing::run_local`] runs ranks as threads, as here:
//!
//! ```
//! use ccl::{testing::run_local, Max, Reduce, Sum};
//!
//! #[derive(Clone, Copy, Debug, PartialEq, Reduce)]
//! struct Moments { n: u64, sum: f64, #[reduce(max)] peak: f32 }
//!
//! let out = run_local(3, |world| -> ccl::Result<_> {
//!     let comm = world.typed::<f32>();
//!     let mut grad = vec![world.rank() as f32; 1000];
//!     comm.all_reduce(&mut grad, Sum)?;             // in place
//!     let stats = world.typed::<Moments>();
//!     let mut m = [Moments { n: 1, sum: 2.0, peak: world.rank() as f32 }];
//!     stats.all_reduce(&mut m, Sum)?;               // n and sum add, peak takes max
//!     Ok((grad[0], m[0]))
//! });
//! for r in out {
//!     assert_eq!(r.unwrap(), (3.0, Moments { n: 3, sum: 6.0, peak: 2.0 }));
//! }
//! ```
//!
//! What a program uses: [`init`], [`Group`], [`Communicator`], the
//! buffers ([`Buffer`], [`comm::SharedBuffer`], [`gpu::DeviceBuffer`]), the
//! operators and [`Reduce`], [`Error`], [`Config`] (every `CCL_*` knob),
//! [`testing`] and [`gpu`]. The layers under them (plan, tune, algo, exec,
//! transport, bootstrap, topo, sim) are private to the crate; the
//! `internals` feature makes them public for ccl-sim, the tuner tools and
//! the schedule proofs. `docs/architecture.md` shows how a call flows
//! through them.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

extern crate self as ccl;

/// The layers under the API: `pub` with the `internals` feature (for
/// ccl-sim, the tuner tools, benches and the schedule proofs), else
/// private to the crate.
macro_rules! layers {
    ($($name:ident),*) => {$(
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        pub(crate) mod $name;
    )*};
}

layers!(algo, bootstrap, exec, machine, plan, sim, topo, transport, tune);

pub mod comm;
pub mod config;
mod error;
pub mod gpu;
pub mod launch;
mod op;
mod reduce;
pub mod testing;
mod units;

pub use bootstrap::init;
pub use ccl_macros::Reduce;
pub use comm::{Buffer, BufferMut, Communicator, Counts, Group, P2pGroup, RegisteredBuffer, Request};
pub use config::Config;
pub use error::{Context, Error, ErrorKind, Result};
pub use op::{Avg, BitAnd, BitOr, BitXor, Max, Min, Op, Prod, ReduceOp, Sum};
pub use reduce::Reduce;
