//! What `cclrun` needs from the library: the rendezvous it serves, the id
//! it hands every rank, the notes it leaves for ranks of a lost peer, the
//! clean-up of a job's shared-memory files, where it pins ranks, and the
//! sockets it watches remote agents through. Nothing here is for programs.

pub use crate::bootstrap::{Rendezvous, UniqueId};
pub use crate::topo::{cpu_of, evenly_oversubscribed};
pub use crate::transport::lost_notes;
pub use crate::transport::shm::Shm;
pub use crate::transport::shm_file::JobFiles;
pub use crate::transport::tcp::{keepalive, route_source};
