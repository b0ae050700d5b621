//! Transports move slots between ranks.
//!
//! A transport connects one direction to one peer and hands back a
//! [`SendConn`] or [`RecvConn`]; after setup the data path is a `match` on
//! these enums, never a trait object. Transports are tried in order, first
//! match wins ([`Registry`]); a pair no transport can connect is an error
//! naming both ranks and every transport that declined.
//!
//! This issue ships the in-process transport ([`local`]) that runs ranks as
//! threads. Shared memory and TCP plug in as further variants: the
//! executor and the algorithms do not change.

pub mod admit;
pub mod call_board;
pub mod doorbell;
pub mod fifo;
pub mod local;
#[cfg(all(test, loom))]
mod loom_tests;
pub mod shm;
pub mod shm_file;
pub mod sync;
pub mod tcp;
pub mod wake;

use crate::bootstrap::lost_notes;
use crate::error::{Error, ErrorKind, Result};
use doorbell::Doorbell;
use fifo::{FifoRecv, FifoSend};
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
}

/// The sending end of a connection.
pub enum SendConn {
    /// A slot FIFO in memory of this process.
    Fifo(FifoSend),
    /// A slot FIFO in memory shared with another process, mapped once both
    /// sides have arrived; and its slot size.
    Shm(shm::Lazy<FifoSend>, usize),
    /// Slots staged here and written to sockets.
    Tcp(tcp::TcpSend),
}

/// The receiving end of a connection.
pub enum RecvConn {
    /// A slot FIFO in memory of this process.
    Fifo(FifoRecv),
    /// A slot FIFO shared with another process, and its slot size.
    Shm(shm::Lazy<FifoRecv>, usize),
    /// Slots read ahead from sockets.
    Tcp(tcp::TcpRecv),
}

impl SendConn {
    /// Room in a free slot for a message of `bytes` bytes (at most a
    /// slot), placed to `spread` in memory FIFOs ([`FifoSend::reserve`]),
    /// if any (`None` also while still connecting).
    pub fn reserve(&mut self, bytes: usize, spread: bool) -> Result<Option<*mut u8>> {
        Ok(match self {
            SendConn::Fifo(f) => f.reserve(bytes, spread),
            SendConn::Shm(l, _) => l.get()?.and_then(|f| f.reserve(bytes, spread)),
            SendConn::Tcp(t) => t.reserve_slot()?,
        })
    }
    /// Publishes the slot [`reserve`](Self::reserve) returned, holding
    /// `bytes` bytes of the call whose fingerprint is `fp`.
    pub fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        match self {
            SendConn::Fifo(f) => f.post(bytes, fp),
            SendConn::Shm(l, _) => {
                if let Ok(Some(f)) = l.get() {
                    f.post(bytes, fp)
                }
            }
            SendConn::Tcp(t) => t.post_slot(bytes, fp),
        }
    }
    /// Tells the receiver, as this end's last frame, that endpoint `lost`
    /// is gone (TCP; memory FIFOs use the doorbell page instead).
    pub fn announce_lost(&mut self, lost: usize) {
        if let SendConn::Tcp(t) = self {
            t.announce_lost(lost);
        }
    }

    /// Whether this end can send straight from the caller's memory
    /// ([`lend`](Self::lend)): sockets, whose kernel copies the bytes out
    /// anyway, so a slot would only add a copy.
    pub fn lends(&self) -> bool {
        self.is_socket()
    }

    /// Whether polling this end is a system call (a socket), not a look at
    /// memory.
    pub fn is_socket(&self) -> bool {
        matches!(self, SendConn::Tcp(_))
    }

    /// Sends `bytes` bytes at `p` as the next message without copying them
    /// into a slot. The slot [`reserve`](Self::reserve) returned goes back,
    /// or with `hold` stays held for the message until it is sent, so that
    /// [`reclaim`](Self::reclaim) can take the message back into it. An
    /// error, sending nothing, where this end does not [`lend`](Self::lends).
    ///
    /// # Safety
    ///
    /// `p` must stay valid for reads of `bytes` bytes, unchanged, until
    /// [`lent`](Self::lent) is 0, [`forget_lent`](Self::forget_lent) has
    /// run, or (with `hold`, for the bytes it covers) [`reclaim`](Self::reclaim).
    pub unsafe fn lend(&mut self, p: *const u8, bytes: usize, fp: &[u64; 4], hold: bool) -> Result<()> {
        if hold && bytes > self.slot_bytes() {
            return Err(Error::internal(format!("a held message of {bytes} B exceeds a slot")));
        }
        match self {
            // SAFETY: the caller's contract is lend's; a held message fits
            // a slot (checked above).
            SendConn::Tcp(t) => unsafe { t.lend(p, bytes, fp, hold) },
            _ => return Err(Error::internal("a memory FIFO was lent a message: it sends only from its slots")),
        }
        Ok(())
    }

    /// Messages of lent memory not yet fully handed to the kernel.
    pub fn lent(&self) -> usize {
        match self {
            SendConn::Tcp(t) => t.lent(),
            _ => 0,
        }
    }

    /// Takes back held lent messages not yet sent that overlap the `bytes`
    /// bytes at `p` (copying them into their slots), so that the lender may
    /// overwrite those bytes.
    pub fn reclaim(&mut self, p: *const u8, bytes: usize) {
        if let SendConn::Tcp(t) = self {
            t.reclaim(p, bytes)
        }
    }

    /// Drops lent messages not yet sent (their memory is about to go: the
    /// call failed); a message cut short breaks this end.
    pub fn forget_lent(&mut self) {
        if let SendConn::Tcp(t) = self {
            t.forget_lent()
        }
    }

    /// Pushes staged data on (TCP); a no-op for memory FIFOs.
    pub fn flush(&mut self) -> Result<()> {
        match self {
            SendConn::Tcp(t) => t.pump(),
            _ => Ok(()),
        }
    }
    /// Slots in flight at most: a slot reserved now was released by the
    /// receiver `nslots` messages ago (None for sockets, which stage).
    pub fn nslots(&mut self) -> Option<usize> {
        match self {
            SendConn::Fifo(f) => Some(f.nslots()),
            SendConn::Shm(l, _) => l.get().ok().flatten().map(|f| f.nslots()),
            SendConn::Tcp(_) => None,
        }
    }

    /// The staging memory of a socket connection (to page-lock for a GPU):
    /// it lives as long as this end.
    pub fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        match self {
            SendConn::Tcp(t) => Some(t.slot_memory()),
            _ => None,
        }
    }

    /// Keeps `a` alive until the receiver has dropped its end too; `false`
    /// where the receiver is in another process (nothing to keep alive for).
    pub fn attach(&mut self, a: fifo::Attachment) -> bool {
        match self {
            SendConn::Fifo(f) => {
                f.attach(a);
                true
            }
            _ => false,
        }
    }

    /// Whether the receiver reads this end's slots from another process
    /// (memory shared between processes), so that memory it may still be
    /// reading cannot be kept alive by [`attach`](Self::attach).
    pub fn read_elsewhere(&self) -> bool {
        matches!(self, SendConn::Shm(..))
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        match self {
            SendConn::Fifo(f) => f.slot_bytes(),
            SendConn::Shm(_, b) => *b,
            SendConn::Tcp(t) => t.slot_bytes(),
        }
    }
}

impl RecvConn {
    /// The oldest arrived slot, its length in bytes and the sender's call
    /// fingerprint, if any.
    pub fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        Ok(match self {
            RecvConn::Fifo(f) => f.peek(),
            RecvConn::Shm(l, _) => l.get()?.and_then(|f| f.peek()),
            RecvConn::Tcp(t) => t.peek_slot()?,
        })
    }
    /// The staging memory of a socket connection (to page-lock for a GPU):
    /// it lives as long as this end.
    pub fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        match self {
            RecvConn::Tcp(t) => Some(t.slot_memory()),
            _ => None,
        }
    }

    /// What the sender attached (a FIFO in this process's memory).
    pub fn attached(&self) -> Option<fifo::Attachment> {
        match self {
            RecvConn::Fifo(f) => f.attached(),
            _ => None,
        }
    }

    /// Whether this end can read a message straight into the call's
    /// memory ([`post_into`](Self::post_into)): sockets, whose kernel
    /// copies the bytes in anyway, so a slot would only add a copy.
    pub fn lands(&self) -> bool {
        self.is_socket()
    }

    /// Whether polling this end is a system call (a socket), not a look at
    /// memory.
    pub fn is_socket(&self) -> bool {
        matches!(self, RecvConn::Tcp(_))
    }

    /// Gives the message `ahead` after the next one [`peek`](Self::peek)
    /// will return a place of `cap` bytes at `p` to be read into instead
    /// of a slot, where it has not started to arrive; `peek` then returns
    /// `p`. Nothing where this end does not [`land`](Self::lands).
    ///
    /// # Safety
    ///
    /// `p` must be valid for writes of `cap` bytes, and nothing else may
    /// read or write them, until that message has been released or
    /// [`withdraw`](Self::withdraw) has run.
    pub unsafe fn post_into(&mut self, ahead: usize, p: *mut u8, cap: usize) {
        if let RecvConn::Tcp(t) = self {
            // SAFETY: the caller's contract is post_into's.
            unsafe { t.post_into(ahead, p, cap) }
        }
    }

    /// Takes back every place given by [`post_into`](Self::post_into)
    /// (their memory is about to go: the call failed); what was read into
    /// them moves into slots.
    pub fn withdraw(&mut self) {
        if let RecvConn::Tcp(t) = self {
            t.withdraw()
        }
    }

    /// Returns the slot [`peek`](Self::peek) returned to the sender.
    pub fn release(&mut self) {
        match self {
            RecvConn::Fifo(f) => f.release(),
            RecvConn::Shm(l, _) => {
                if let Ok(Some(f)) = l.get() {
                    f.release()
                }
            }
            RecvConn::Tcp(t) => t.release_slot(),
        }
    }
    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        match self {
            RecvConn::Fifo(f) => f.slot_bytes(),
            RecvConn::Shm(_, b) => *b,
            RecvConn::Tcp(t) => t.slot_bytes(),
        }
    }
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
