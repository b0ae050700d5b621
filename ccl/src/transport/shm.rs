//! Shared memory between processes of one host.
//!
//! Files are made, named and opened as [`super::shm_file`] says: no other
//! user can plant, pre-create or forge them. Every rank maps its doorbell
//! (`ccl-<job>-b<rank>-<tag>-p<pid>`) before it joins the rendezvous, so
//! peers can always open it, and binds its wake socket beside it
//! (`-w<rank>-`: see [`super::wake`]). A connection's FIFO is a file
//! `ccl-<job>-<comm>-<from>-<to>-<channel>-<tag>-p<pid>-<pid>` that
//! whichever side comes first creates (zero-filled, the FIFO's initial
//! state) and the second side maps and unlinks, so nothing named is left
//! once both ends hold it. A file whose second side never came (its rank
//! failed) may hold data still owed to it, so the creator leaves it; a
//! rank removes its doorbell when it drops the transport, and `cclrun`
//! removes whatever `ccl-<job>-*` is left when the job ends. Every start
//! also sweeps files whose owning processes are all gone, which covers
//! ranks killed together with their launcher.
//! Connecting never blocks: a connection whose peer has not arrived yet is
//! retried by the progress engine on each poll.

use super::call_board::{CallBoard, Words};
use super::doorbell::{Bell, BellRef, Doorbell};
use super::fifo::{FifoMem, FifoRecv, FifoSend};
use super::shm_file::{self, JobFiles};
use super::wake::WakeSocket;
use super::{ConnKey, Geometry, Offers, RecvConn, RecvVerbs, SendConn, SendVerbs, Transport};
use crate::error::{Error, ErrorKind, Result};
use memmap2::MmapMut;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub(crate) use shm_file::DIR;

/// Bytes of a doorbell's page.
const BELL_BYTES: u64 = 4096;

/// A doorbell in a shared mapping, and its owner's wake socket.
pub struct BellMap {
    map: MmapMut,
    owned: Option<PathBuf>,
    /// The owner's socket (bound, where it could be), or a peer's handle
    /// on it.
    wake: Option<WakeSocket>,
}

impl AsRef<Doorbell> for BellMap {
    fn as_ref(&self) -> &Doorbell {
        // SAFETY: the mapping is at least a page, page-aligned, zero-filled
        // when created (a valid Doorbell: three zero atomics), and lives as
        // long as `self`.
        unsafe { &*(self.map.as_ptr() as *const Doorbell) }
    }
}

impl Bell for BellMap {
    fn doorbell(&self) -> &Doorbell {
        self.as_ref()
    }

    /// Rings, and wakes the owner through its socket if it polls one.
    fn ring(&self) {
        super::wake::ring(self.doorbell(), self.wake.as_ref());
    }
}

impl BellMap {
    /// The owner's wake socket, for it to poll (`None` on a peer's map, or
    /// where it could not be bound).
    pub fn wake(&self) -> Option<&WakeSocket> {
        self.wake.as_ref().filter(|w| w.fd().is_some())
    }

    /// The rank's last calls ([`CallBoard`]), after the doorbell and the cause.
    fn board(&self) -> &CallBoard {
        // SAFETY: offset 128 of a page-sized, page-aligned, zero-filled
        // mapping that lives as long as `self`; a CallBoard is atomics
        // (valid when zero, 8-byte aligned) and ends well within the page.
        unsafe { &*(self.map.as_ptr().add(128) as *const CallBoard) }
    }

    /// Root cause left by this rank when it failed: 1 + the lost endpoint, or 0.
    fn cause(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: offset 64 of a page-sized, page-aligned, zero-filled
        // mapping that lives as long as `self`; AtomicU64 accepts any bits.
        unsafe { &*(self.map.as_ptr().add(64) as *const std::sync::atomic::AtomicU64) }
    }
}

impl Drop for BellMap {
    fn drop(&mut self) {
        if let Some(p) = &self.owned {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Maps `f` with every page in place (MAP_POPULATE): a connection's first
/// call pays for its memory at once, instead of its first 32 calls each
/// faulting in a fresh slot's pages.
fn map_file(f: &File) -> Result<MmapMut> {
    // SAFETY: the file is a shm object of this job that only ccl processes
    // map; all concurrent access goes through atomics or through FIFO slots
    // owned by one side at a time (see fifo.rs).
    unsafe { memmap2::MmapOptions::new().populate().map_mut(f) }.map_err(|e| Error::transport(format!("mmap: {e}")))
}

/// One process's shared-memory transport.
pub struct Shm {
    files: JobFiles,
    me: usize,
    hosts: Vec<String>,
    pids: Vec<u32>,
    nslots: usize,
    slot_bytes: usize,
    bell: Arc<BellMap>,
    peer_bells: Mutex<HashMap<usize, Arc<BellMap>>>,
    enabled: bool,
}

/// Whether process `pid` has exited: it is gone, or a zombie that its
/// parent has not reaped (its parent stopped, say) and `kill(pid, 0)`
/// still finds.
pub fn exited(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return true };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(p, 0) } == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    // the state follows the command name, which may hold anything
    let stat = std::fs::read(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2));
    matches!(state, Some(b'Z' | b'X'))
}

/// Names of the shared-memory directory that one sweep for stale files
/// reads at most ([`Shm::sweep_stale`]).
pub const SWEEP_ENTRIES: usize = 1 << 16;

impl Shm {
    /// Path of rank `rank`'s doorbell in a job; `pid` owns it.
    pub fn bell_path(files: &JobFiles, rank: usize, pid: u32) -> PathBuf {
        files.path(&format!("b{rank}"), &[pid])
    }

    /// Path of rank `rank`'s wake socket in a job; `pid` owns it.
    fn wake_path(files: &JobFiles, rank: usize, pid: u32) -> PathBuf {
        files.path(&format!("w{rank}"), &[pid])
    }

    /// `peer`'s doorbell, mapped from `f`, with a handle on its wake socket.
    fn peer_map(&self, peer: usize, f: &File) -> Result<BellMap> {
        let pid = self.pids.get(peer).copied().unwrap_or(0);
        let wake = Some(WakeSocket::of_peer(Self::wake_path(&self.files, peer, pid)));
        Ok(BellMap { map: map_file(f)?, owned: None, wake })
    }

    /// Removes this user's files of any job whose owning processes have
    /// all exited (names end in `-p<pid>[-<pid>]`): what a crash, or a
    /// launcher killed with SIGKILL, left behind. Other users' files are
    /// theirs to sweep, and are passed over before any process is looked
    /// up; at most `SWEEP_ENTRIES` names are read, so that a directory
    /// that others filled with junk costs a bounded time. Run once per
    /// host and job, off the path of a rank's start (cclrun and its agents,
    /// or a thread of each rank started by another launcher).
    pub fn sweep_stale() {
        let alive = |pid: &str| pid.parse::<u32>().map_or(true, |p| !exited(p));
        let Ok(dir) = std::fs::read_dir(DIR) else { return };
        for e in dir.take(SWEEP_ENTRIES).flatten() {
            let name = e.file_name();
            let Some((_, pids)) = name.to_str().and_then(|n| n.strip_prefix("ccl-")?.rsplit_once("-p")) else {
                continue;
            };
            if shm_file::ours(&e.path()) && pids.split('-').all(|p| !alive(p)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Creates this rank's doorbell; call before joining the rendezvous.
    pub fn create_bell(files: &JobFiles, rank: usize) -> Result<Arc<BellMap>> {
        let path = Self::bell_path(files, rank, std::process::id());
        let f = files.create(&path, BELL_BYTES)?;
        let map = map_file(&f).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })?;
        // without a wake socket, a rank that also polls network sockets
        // naps in short polls instead (Registry::sleep)
        let wake = WakeSocket::bind(&Self::wake_path(files, rank, std::process::id())).ok();
        Ok(Arc::new(BellMap { map, owned: Some(path), wake }))
    }

    /// The transport of rank `me`, given every rank's host and pid.
    /// With `enabled` false it connects no one (CCL_SHM_DISABLE) but still
    /// provides the doorbell and the liveness checks of local peers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        files: &JobFiles,
        me: usize,
        bell: Arc<BellMap>,
        hosts: Vec<String>,
        pids: Vec<u32>,
        nslots: usize,
        slot_bytes: usize,
        enabled: bool,
    ) -> Self {
        Shm {
            files: files.clone(),
            me,
            hosts,
            pids,
            nslots,
            slot_bytes,
            bell,
            peer_bells: Mutex::new(HashMap::new()),
            enabled,
        }
    }

    /// `peer`'s doorbell page, if it is mapped here or still on disk.
    fn peer_page(&self, peer: usize) -> Option<Arc<BellMap>> {
        if let Some(b) = self.peer_bells.lock().ok()?.get(&peer) {
            return Some(Arc::clone(b));
        }
        let path = Self::bell_path(&self.files, peer, self.pids.get(peer).copied().unwrap_or(0));
        let f = self.files.open(&path, BELL_BYTES).ok()??;
        let page = Arc::new(self.peer_map(peer, &f).ok()?);
        self.peer_bells.lock().ok()?.insert(peer, Arc::clone(&page));
        Some(page)
    }

    fn peer_bell(&self, peer: usize) -> Result<BellRef> {
        let mut bells = self.peer_bells.lock().map_err(|_| Error::internal("bell table poisoned"))?;
        if let Some(b) = bells.get(&peer) {
            return Ok(Arc::clone(b) as BellRef);
        }
        let path = Self::bell_path(&self.files, peer, self.pids.get(peer).copied().unwrap_or(0));
        let f = match self.files.open(&path, BELL_BYTES) {
            Ok(Some(f)) => f,
            // the peer has finished and removed its bell: nobody to wake
            Ok(None) => return Ok(Arc::new(Doorbell::new()) as BellRef),
            Err(e) => return Err(e.with_peer(peer)),
        };
        let b = Arc::new(self.peer_map(peer, &f)?);
        bells.insert(peer, Arc::clone(&b));
        Ok(b as BellRef)
    }

    fn fifo_path(&self, key: ConnKey) -> PathBuf {
        let pid = |r: usize| self.pids.get(r).copied().unwrap_or(0);
        let what = format!("{:016x}-{}-{}-{}", key.comm, key.from, key.to, key.channel);
        self.files.path(&what, &[pid(key.from), pid(key.to)])
    }

    /// An opener that maps the connection's FIFO once both sides can.
    fn opener(&self, key: ConnKey) -> impl FnMut() -> Result<Option<Arc<FifoMem>>> + Send + 'static {
        let (path, nslots, slot_bytes) = (self.fifo_path(key), self.nslots, self.slot_bytes);
        let files = self.files.clone();
        move || {
            let size = FifoMem::size(nslots, slot_bytes).ok_or_else(|| Error::internal("fifo size"))? as u64;
            if let Some(f) = files.try_create(&path, size)? {
                return Ok(FifoMem::in_map(map_file(&f)?, nslots, slot_bytes));
            }
            // the peer made it (or is making it: not sealed yet)
            let Some(f) = files.open(&path, size)? else { return Ok(None) };
            let mem = FifoMem::in_map(map_file(&f)?, nslots, slot_bytes);
            let _ = std::fs::remove_file(&path); // both ends hold it now
            Ok(mem)
        }
    }
}

/// One end of a connection whose FIFO is mapped on first successful poll,
/// and its slot size.
pub struct Lazy<C> {
    conn: Option<C>,
    open: Box<dyn FnMut() -> Result<Option<C>> + Send>,
    slot_bytes: usize,
}

/// The sending end of a shared-memory connection.
pub type ShmSend = Lazy<FifoSend>;
/// The receiving end of a shared-memory connection.
pub type ShmRecv = Lazy<FifoRecv>;

impl<C> Lazy<C> {
    /// The connection, if both sides have arrived.
    pub fn get(&mut self) -> Result<Option<&mut C>> {
        if self.conn.is_none() {
            self.conn = (self.open)()?;
        }
        Ok(self.conn.as_mut())
    }
}

/// Slots read by the peer's process from a mapping of their own.
const OFFERS: Offers = Offers { read_elsewhere: true, lends: false, lands: false, pollable: false, staged: false };

impl SendVerbs for ShmSend {
    fn offers(&self) -> Offers {
        OFFERS
    }
    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
    #[inline]
    fn reserve(&mut self, bytes: usize, spread: bool) -> Result<Option<*mut u8>> {
        Ok(self.get()?.and_then(|f| f.reserve(bytes, spread)))
    }
    #[inline]
    fn post(&mut self, bytes: usize, fp: &[u64; 4]) {
        if let Ok(Some(f)) = self.get() {
            f.post(bytes, fp)
        }
    }
}

impl RecvVerbs for ShmRecv {
    fn offers(&self) -> Offers {
        OFFERS
    }
    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
    #[inline]
    fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>> {
        Ok(self.get()?.and_then(|f| f.peek()))
    }
    #[inline]
    fn release(&mut self) {
        if let Ok(Some(f)) = self.get() {
            f.release()
        }
    }
}

impl Transport for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn can_connect(&self, from: usize, to: usize) -> bool {
        self.enabled && matches!((self.hosts.get(from), self.hosts.get(to)), (Some(a), Some(b)) if a == b)
    }

    fn connect_send(&self, key: ConnKey, _ring: Geometry) -> Result<SendConn> {
        let bell = self.peer_bell(key.to)?;
        let mut open = self.opener(key);
        let open = move || Ok(open()?.map(|m| FifoSend::new(m, Arc::clone(&bell))));
        Ok(Lazy { conn: None, open: Box::new(open), slot_bytes: self.slot_bytes }.into())
    }

    fn connect_recv(&self, key: ConnKey, _ring: Geometry) -> Result<RecvConn> {
        let bell = self.peer_bell(key.from)?;
        let mut open = self.opener(key);
        let open = move || Ok(open()?.map(|m| FifoRecv::new(m, Arc::clone(&bell))));
        Ok(Lazy { conn: None, open: Box::new(open), slot_bytes: self.slot_bytes }.into())
    }

    fn bell(&self) -> &Doorbell {
        self.bell.as_ref().as_ref()
    }

    fn wake(&self) -> Option<&WakeSocket> {
        self.bell.wake()
    }

    fn uses_bell(&self) -> bool {
        self.enabled
    }

    fn post_call(&self, comm: u64, fp: &Words) {
        self.bell.board().post(comm, fp);
    }

    fn peer_call(&self, peer: usize, comm: u64, seq: u64) -> Option<Words> {
        if !self.sees_calls_of(peer) {
            return None;
        }
        self.peer_page(peer)?.board().get(comm, seq)
    }

    fn sees_calls_of(&self, peer: usize) -> bool {
        peer != self.me && self.hosts.get(peer).is_some() && self.hosts.get(peer) == self.hosts.get(self.me)
    }

    fn publish_lost(&self, lost: usize) {
        let _ = self.bell.cause().compare_exchange(0, lost as u64 + 1, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn check_alive(&self, peers: &[usize]) -> Result<()> {
        for &rank in peers {
            let (Some(&pid), Some(host)) = (self.pids.get(rank), self.hosts.get(rank)) else { continue };
            if rank == self.me || Some(host) != self.hosts.get(self.me) {
                continue;
            }
            if exited(pid) {
                // the root cause, if this peer left because it lost someone itself
                let cause = self.peer_page(rank).map_or(0, |p| p.cause().load(Ordering::SeqCst));
                let root = (cause as usize).wrapping_sub(1);
                if cause != 0 && root != self.me && root < self.hosts.len() {
                    let why = format!("reported by rank {rank} (process {pid}), which has exited because of it");
                    let lost = ErrorKind::PeerLost { rank: root, host: self.hosts[root].clone(), why };
                    return Err(Error::new(lost).with_peer(rank));
                }
                let why = format!("process {pid} has exited");
                return Err(Error::new(ErrorKind::PeerLost { rank, host: host.clone(), why }).with_peer(rank));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Registry;
    use std::os::unix::io::AsRawFd;
    use std::time::{Duration, Instant};

    /// Network peers that stay quiet: a socket to poll that never becomes
    /// ready.
    struct Quiet(std::os::unix::net::UnixDatagram, Doorbell);

    impl Transport for Quiet {
        fn name(&self) -> &'static str {
            "quiet"
        }
        fn can_connect(&self, _: usize, _: usize) -> bool {
            false
        }
        fn connect_send(&self, _: ConnKey, _: Geometry) -> Result<SendConn> {
            Err(Error::internal("quiet"))
        }
        fn connect_recv(&self, _: ConnKey, _: Geometry) -> Result<RecvConn> {
            Err(Error::internal("quiet"))
        }
        fn bell(&self) -> &Doorbell {
            &self.1
        }
        fn check_alive(&self, _: &[usize]) -> Result<()> {
            Ok(())
        }
        fn poll_fds(&self, out: &mut Vec<libc::pollfd>) {
            out.push(libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        fn uses_bell(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_zombie_has_exited() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        // not yet reaped: kill(pid, 0) still finds it
        let t = Instant::now();
        while !exited(pid) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(exited(pid), "a zombie counts as running");
        child.wait().expect("reap");
        assert!(exited(pid));
        assert!(!exited(std::process::id()));
    }

    #[test]
    fn the_sweep_removes_this_user_s_files_of_exited_processes_only() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        let tag = format!("ccl-sweeptest{}", std::process::id());
        let stale = std::path::Path::new(DIR).join(format!("{tag}-b0-p{dead}"));
        let live = std::path::Path::new(DIR).join(format!("{tag}-b1-p{}", std::process::id()));
        let mixed = std::path::Path::new(DIR).join(format!("{tag}-c-p{dead}-{}", std::process::id()));
        for p in [&stale, &live, &mixed] {
            std::fs::write(p, b"").expect("file");
        }
        Shm::sweep_stale();
        assert!(!stale.exists(), "a dead owner's file stays");
        assert!(live.exists() && mixed.exists(), "a live owner's file went");
        for p in [&live, &mixed] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn a_rank_polling_its_sockets_sleeps_until_a_peer_of_its_host_rings() {
        let (files, pid) = (&JobFiles::fresh(), std::process::id());
        let hosts = vec!["h".to_string(); 2];
        let shm = |me| {
            let bell = Shm::create_bell(files, me).expect("bell");
            Shm::new(files, me, bell, hosts.clone(), vec![pid; 2], 4, 4096, true)
        };
        let (s0, s1) = (shm(0), shm(1));
        let quiet = Quiet(std::os::unix::net::UnixDatagram::unbound().expect("socket"), Doorbell::new());
        let reg = Registry::new(vec![Arc::new(s0), Arc::new(quiet)]).expect("registry");
        // rank 0 sleeps in one poll(), counted by its doorbell (where it
        // used to nap in 1 ms polls, never counted), until `ring`, from
        // another thread, wakes it: how long it slept of its 30 s
        let woken_by = |ring: &dyn Fn()| {
            let seen = reg.bell().seq();
            std::thread::scope(|sc| {
                let sleeper = sc.spawn(|| {
                    let t = Instant::now();
                    reg.sleep(seen, Duration::from_secs(30));
                    t.elapsed()
                });
                let t = Instant::now();
                while !reg.bell().polling() {
                    assert!(t.elapsed() < Duration::from_secs(10), "rank 0 never slept in poll()");
                    std::thread::yield_now();
                }
                ring();
                sleeper.join().expect("sleeper")
            })
        };
        // rank 1 rings: rank 0 wakes, not at the end of its time
        let slept = woken_by(&|| s1.peer_bell(0).expect("rank 0's bell").ring());
        assert!(slept < Duration::from_secs(20), "slept {slept:?}");
        // and so does its own ring, from another thread (an abort)
        let slept = woken_by(&|| reg.ring());
        assert!(slept < Duration::from_secs(20), "slept {slept:?}");
    }
}
