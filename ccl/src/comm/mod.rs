//! The communicator API: [`Group`] (untyped), [`Communicator<T>`] (typed),
//! [`Request`] (non-blocking calls).

mod agree;
mod buffer;
mod counts;
pub(crate) mod exit;
mod group;
mod grouped;
mod p2p;
mod registered;
mod request;
mod rooted;
mod scan;
mod shared;
mod split;
mod typed;
mod varying;

pub use crate::exec::engine::install_dump_on_sigusr1;
pub use agree::MISMATCH_EXIT;
#[doc(hidden)]
pub use buffer::Place;
pub use buffer::{Buffer, BufferMut};
pub use counts::Counts;
pub use group::Group;
pub use grouped::P2pGroup;
pub use registered::RegisteredBuffer;
pub use request::Request;
pub use shared::SharedBuffer;
#[doc(hidden)]
pub use shared::Window;
pub use typed::Communicator;
