//! Transports move slots between ranks.
//!
//! A transport connects one direction to one peer and hands back a
//! [`SendConn`] or [`RecvConn`]: every transport's ends implement the same
//! verbs ([`SendVerbs`], [`RecvVerbs`]) and say what else they
//! [`Offers`]; the executor asks nothing else of them. After setup the
//! data path is a `match` on these enums, never a trait object.
//! Transports are tried in order, first match wins ([`Registry`]); a pair
//! no transport can connect is an error naming both ranks and every
//! transport that declined.
//!
//! Adding a transport is a folder here whose ends implement the verbs, one
//! line in the list of connection kinds below, and its place in the
//! bootstrap's order: the executor and the algorithms do not change.

pub mod admit;
pub mod call_board;
mod conn;
pub mod doorbell;
pub mod fifo;
pub mod local;
pub mod rdma;
#[cfg(all(test, loom))]
mod loom_tests;
pub mod shm;
pub mod shm_file;
pub mod sync;
pub mod tcp;
pub mod wake;

pub mod lost_notes;
use crate::error::{Error, ErrorKind, Result};
use conn::links;
pub use conn::{Offers, RecvVerbs, SendVerbs};
use doorbell::Doorbell;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting rank checks that its peers are alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

/// Identifies one direction of one connection: communicator, endpoints
/// (world ranks), channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// The communicator's id.
    pub comm: u64,
    /// Sending endpoint.
    pub from: usize,
    /// Receiving endpoint.
    pub to: usize,
    /// Channel.
    pub channel: u32,
}

/// How a connection's slot memory is cut: `nslots` slots of `slot_bytes`.
/// A group decides it ([`Config::slots_on`](crate::Config::slots_on)),
/// the same on every rank. Sockets size their rings by it; memory
/// transports fix theirs per process and only need slots at least as
/// large (the group checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Slots per connection.
    pub nslots: usize,
    /// Bytes per slot.
    pub slot_bytes: usize,
}

/// A way to reach peers.
pub trait Transport: Send + Sync {
    /// Short name for messages (`"local"`).
    fn name(&self) -> &'static str;
    /// Whether this transport connects endpoint `from` to endpoint `to`.
    fn can_connect(&self, from: usize, to: usize) -> bool;
    /// The sending end of `key` (this endpoint is `key.from`), cut as `ring`.
    fn connect_send(&self, key: ConnKey, ring: Geometry) -> Result<SendConn>;
    /// The receiving end of `key` (this endpoint is `key.to`), cut as `ring`.
    fn connect_recv(&self, key: ConnKey, ring: Geometry) -> Result<RecvConn>;
    /// The doorbell this endpoint sleeps on; peers ring it when they post
    /// to it or free a slot of its.
    fn bell(&self) -> &Doorbell;
    /// `Err` if the job is going down or one of `peers` (endpoints this
    /// rank is stuck waiting on) is gone: waits end with it.
    fn check_alive(&self, peers: &[usize]) -> Result<()>;
    /// Sockets to `poll()` while idle (none for memory transports).
    fn poll_fds(&self, _out: &mut Vec<libc::pollfd>) {}
    /// This rank is failing because endpoint `lost` is gone: leave word
    /// where peers that then find this rank gone can read the root cause.
    fn publish_lost(&self, _lost: usize) {}
    /// Posts collective `fp` of communicator `comm`, as this endpoint
    /// starts it, where peers can read it ([`call_board`]).
    fn post_call(&self, _comm: u64, _fp: &call_board::Words) {}
    /// What endpoint `peer` posted as call `seq` of communicator `comm`,
    /// where this transport can see it (or was told it).
    fn peer_call(&self, _peer: usize, _comm: u64, _seq: u64) -> Option<call_board::Words> {
        None
    }
    /// Whether this transport reads endpoint `peer`'s posted calls where
    /// they are (a peer of the same host).
    fn sees_calls_of(&self, _peer: usize) -> bool {
        false
    }
    /// Tells endpoint `peer`, which cannot read them, this endpoint's last
    /// `calls` of communicator `comm`.
    fn tell_calls(&self, _peer: usize, _comm: u64, _calls: &[call_board::Words]) -> Result<()> {
        Ok(())
    }
    /// Whether peers wake this rank through its doorbell.
    fn uses_bell(&self) -> bool {
        true
    }
    /// The socket through which peers that ring the doorbell wake this
    /// rank while it polls network sockets, if it has one.
    fn wake(&self) -> Option<&wake::WakeSocket> {
        None
    }
    /// Registers the `len` bytes at `p` with this transport's device until
    /// the returned registration drops, so that messages lent from them are
    /// sent straight from there; `None` where there is nothing to register.
    ///
    /// # Safety
    ///
    /// The memory must stay valid until the registration drops.
    unsafe fn register(&self, _p: *mut u8, _len: usize) -> Result<Option<Registration>> {
        Ok(None)
    }
}

/// Memory registered by [`Transport::register`], until dropped.
pub type Registration = Box<dyn std::any::Any + Send + Sync>;

/// A slice registered with the RDMA devices of the group that made it
/// ([`Communicator::register`](crate::Communicator::register), NCCL's
/// `ncclCommRegister`): messages that blocking calls on it send over RDMA
/// are written straight from it, not copied into the connection's slots
/// first. Dereferences to the slice. Its registrations end when it drops,
/// before its borrow does; without RDMA there are none, and it is the
/// slice as it is.
pub struct RegisteredBuffer<'a, T> {
    pub(crate) buf: &'a mut [T],
    regs: Vec<Registration>,
}

impl<T> RegisteredBuffer<'_, T> {
    /// Whether any device registered it (none: no RDMA in the group).
    pub fn is_registered(&self) -> bool {
        !self.regs.is_empty()
    }
}

links! {
    Fifo(fifo::FifoSend, fifo::FifoRecv),
    Shm(shm::ShmSend, shm::ShmRecv),
    Tcp(tcp::TcpSend, tcp::TcpRecv),
    Rdma(rdma::RdmaSend, rdma::RdmaRecv),
}

/// Sleeps in `poll()` on `fds` for at most `timeout` (whole milliseconds).
fn poll_on(fds: &mut [libc::pollfd], timeout: std::time::Duration) {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

/// Transports in order of preference; the first that can connect a pair does.
pub struct Registry {
    list: Vec<Arc<dyn Transport>>,
    /// Where the launcher notes ranks it gave up on ([`lost_notes`]).
    lost_notes: Option<PathBuf>,
    /// When peers were last checked for life.
    last_check: Mutex<Instant>,
    /// How this endpoint's job names and seals its files in `/dev/shm`.
    files: shm_file::JobFiles,
}

impl Registry {
    /// A registry trying `list` in order; the first also provides the
    /// doorbell and liveness of this endpoint.
    pub fn new(list: Vec<Arc<dyn Transport>>) -> Result<Self> {
        if list.is_empty() {
            return Err(Error::internal("no transport"));
        }
        let files = shm_file::JobFiles::of_process().clone();
        Ok(Registry { list, lost_notes: None, last_check: Mutex::new(Instant::now()), files })
    }

    /// Names this endpoint's files as `files` does (its job's), instead of
    /// as its process's own.
    pub fn with_files(mut self, files: shm_file::JobFiles) -> Self {
        self.files = files;
        self
    }

    /// How this endpoint's job names and seals its files in `/dev/shm`.
    pub fn files(&self) -> &shm_file::JobFiles {
        &self.files
    }

    /// Also fails a wait on a rank the launcher noted as lost at `at`.
    pub fn with_lost_notes(mut self, at: Option<PathBuf>) -> Self {
        self.lost_notes = at;
        self
    }

    fn pick(&self, from: usize, to: usize) -> Result<&Arc<dyn Transport>> {
        self.list.iter().find(|t| t.can_connect(from, to)).ok_or_else(|| {
            let names: Vec<_> = self.list.iter().map(|t| t.name()).collect();
            Error::transport(format!("no transport connects endpoint {from} to {to} (declined: {})", names.join(", ")))
        })
    }

    /// Connects the sending end of `key`, cut as `ring`.
    pub fn connect_send(&self, key: ConnKey, ring: Geometry) -> Result<SendConn> {
        self.pick(key.from, key.to)?.connect_send(key, ring)
    }

    /// Connects the receiving end of `key`, cut as `ring`.
    pub fn connect_recv(&self, key: ConnKey, ring: Geometry) -> Result<RecvConn> {
        self.pick(key.from, key.to)?.connect_recv(key, ring)
    }

    /// `buf`, registered with every transport that registers memory
    /// ([`Transport::register`]) for as long as it stays borrowed.
    pub fn register<'a, T>(&self, buf: &'a mut [T]) -> Result<RegisteredBuffer<'a, T>> {
        let (p, len) = (buf.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(buf));
        let mut regs = Vec::new();
        if len > 0 {
            for t in &self.list {
                // SAFETY: `buf` stays borrowed, so valid, while the
                // registrations live: both go with the `RegisteredBuffer`.
                regs.extend(unsafe { t.register(p, len) }?);
            }
        }
        Ok(RegisteredBuffer { buf, regs })
    }

    /// This endpoint's doorbell.
    pub fn bell(&self) -> &Doorbell {
        self.list[0].bell()
    }

    /// Rings this endpoint's own doorbell (an abort from another thread),
    /// waking it wherever it sleeps.
    pub fn ring(&self) {
        wake::ring(self.bell(), self.list[0].wake());
    }

    /// Sleeps until a peer rings (`seen` is the bell's count read before
    /// looking for work), a socket is ready, or `timeout` passes. With
    /// both sockets and a bell to watch, it polls the sockets and its wake
    /// socket, which peers that ring meanwhile send to; without a wake
    /// socket (ranks as threads), it polls the sockets in short naps.
    pub fn sleep(&self, seen: u32, timeout: std::time::Duration) {
        let mut fds = Vec::new();
        self.list.iter().for_each(|t| t.poll_fds(&mut fds));
        if fds.is_empty() {
            return self.bell().sleep(seen, timeout);
        }
        if !self.list.iter().any(|t| t.uses_bell()) {
            return poll_on(&mut fds, timeout);
        }
        let wake = self.list[0].wake();
        match wake.and_then(|w| w.fd()) {
            Some(fd) => {
                fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
                self.bell().poll_while(seen, || poll_on(&mut fds, timeout));
                wake.into_iter().for_each(wake::WakeSocket::drain);
            }
            None => poll_on(&mut fds, timeout.min(std::time::Duration::from_millis(1))),
        }
    }

    /// Posts collective `fp` of communicator `comm` where this endpoint's
    /// peers can read it (on the transport that provides its doorbell).
    pub fn post_call(&self, comm: u64, fp: &call_board::Words) {
        self.list[0].post_call(comm, fp);
    }

    /// What endpoint `peer` posted as call `seq` of communicator `comm`,
    /// where some transport can see it (a peer of this host).
    pub fn peer_call(&self, peer: usize, comm: u64, seq: u64) -> Option<call_board::Words> {
        self.list.iter().find_map(|t| t.peer_call(peer, comm, seq))
    }

    /// Tells endpoint `peer` this endpoint's last `calls` of communicator
    /// `comm`, where no transport lets it read them itself.
    pub fn tell_calls(&self, peer: usize, comm: u64, calls: &[call_board::Words]) -> Result<()> {
        if self.list.iter().any(|t| t.sees_calls_of(peer)) {
            return Ok(());
        }
        self.list.iter().try_for_each(|t| t.tell_calls(peer, comm, calls))
    }

    /// Leaves word, on every transport, that endpoint `lost` is gone.
    pub fn publish_lost(&self, lost: usize) {
        self.list.iter().for_each(|t| t.publish_lost(lost));
    }

    /// Whether every transport is up and `peers` (endpoints) are alive:
    /// not noted lost by the launcher, nor gone as each transport sees it.
    /// Checked at most every `LIVENESS_EVERY` (100 ms); in between, `Ok`.
    pub fn check_alive(&self, peers: &[usize]) -> Result<()> {
        let Ok(mut last) = self.last_check.lock() else { return Ok(()) };
        if peers.is_empty() || last.elapsed() < LIVENESS_EVERY {
            return Ok(());
        }
        *last = Instant::now();
        let noted = self.lost_notes.as_deref().map(lost_notes::read).unwrap_or_default();
        if let Some(n) = noted.into_iter().find(|n| peers.contains(&n.rank)) {
            let rank = n.rank;
            return Err(Error::new(ErrorKind::PeerLost { rank, host: n.host, why: n.why }).with_peer(rank));
        }
        self.list.iter().try_for_each(|t| t.check_alive(peers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_on_a_rank_the_launcher_gave_up_on_fails() {
        let at = lost_notes::path(&shm_file::JobFiles::fresh(), std::process::id());
        let fabric = local::Fabric::new(3, 2, 64);
        let reg = Registry::new(vec![Arc::new(fabric.endpoint(0)) as Arc<dyn Transport>])
            .expect("registry")
            .with_lost_notes(Some(at.clone()));
        let checked = |peers: &[usize]| {
            std::thread::sleep(LIVENESS_EVERY); // checks are spaced that far apart
            reg.check_alive(peers)
        };
        assert!(checked(&[1, 2]).is_ok(), "no notes yet");
        lost_notes::add(&at, &[2], "host3", "cclrun lost its connection to it").expect("note");
        assert!(checked(&[1]).is_ok(), "rank 1 is not noted");
        let e = checked(&[1, 2]).expect_err("rank 2 is noted lost");
        std::fs::remove_file(&at).expect("remove");
        assert!(matches!(e.kind(), ErrorKind::PeerLost { rank: 2, .. }), "{e}");
        assert!(e.to_string().contains("lost rank 2 on host3: cclrun lost its connection to it"), "{e}");
        assert_eq!(e.context().peer, Some(2), "{e}");
    }
}
