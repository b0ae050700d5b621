//! An emulated GPU for tests without one: device memory is host memory
//! that this module hands out and recognises, and each stream is a worker
//! thread that runs its copies, kernels (the host functions of
//! [`Kernels`]) and flag operations in order, concurrently with the host
//! and with the other streams, as on a GPU: work the caller forgot to wait
//! for may not have happened yet, and a wait on a flag blocks only its
//! stream. A wait that outlasts its limit fails the stream (every later
//! synchronisation reports it), so a missing flag is a reported deadlock,
//! not a hang. Each allocation is a memfd mapped shared, so an IPC handle
//! (process id, descriptor, length) lets another process of this host map
//! it through `/proc/<pid>/fd/<fd>`, the way ranks that share a GPU map
//! each other's memory with CUDA IPC.

use super::{Device, Emulation, Kernels, Launch, Memory, Until};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Emulated devices by ordinal.
static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Emu>>>> = OnceLock::new();
/// Stream ids, unique across devices (0 is no stream).
static STREAMS: AtomicU64 = AtomicU64::new(1);
const MAGIC: &[u8; 8] = b"ccl-emu\0";
/// How long a flag wait lasts by default before its stream fails.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// One allocation: its length and the memfd behind it.
#[derive(Clone, Copy)]
struct Alloc {
    len: usize,
    fd: i32,
}

#[derive(Clone)]
enum Work {
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Launch(Box<Kernels>, Launch),
    Write {
        addr: u64,
        value: u64,
    },
    Wait {
        addr: u64,
        until: Until,
    },
    /// Waits until `lane` has run `upto` operations.
    After {
        lane: Arc<Lane>,
        upto: u64,
    },
}

/// One emulated stream: its queue, and how far its worker has got.
#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
    moved: Condvar,
}

#[derive(Default)]
struct LaneState {
    ops: VecDeque<Work>,
    /// Operations ever queued, and those finished (run, or dropped after a failure).
    queued: u64,
    ran: u64,
    /// What failed the stream (sticky, as a CUDA error is).
    failed: Option<String>,
    /// The stream was destroyed: the worker ends once the queue is empty.
    closed: bool,
    /// The capture its work goes into instead of the queue.
    capture: Option<Arc<Mutex<Capture>>>,
}

/// Work captured into a graph, from the stream the capture began on and
/// those that joined it, in the order it was queued.
struct Capture {
    origin: u64,
    works: Vec<Work>,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the worker of a new lane.
    fn start(emu: std::sync::Weak<Emu>, id: u64) -> Arc<Lane> {
        let lane = Arc::new(Lane::default());
        let l = Arc::clone(&lane);
        let _ = std::thread::Builder::new().name(format!("ccl-emu-stream-{id}")).spawn(move || l.work(&emu, id));
        lane
    }

    fn work(&self, emu: &std::sync::Weak<Emu>, id: u64) {
        loop {
            let w = {
                let mut s = self.lock();
                loop {
                    if let Some(w) = s.ops.pop_front() {
                        break w;
                    }
                    if s.closed {
                        return;
                    }
                    s = self.moved.wait(s).unwrap_or_else(|e| e.into_inner());
                }
            };
            let how = || emu.upgrade().map(|e| *e.how.lock().unwrap_or_else(|e| e.into_inner())).unwrap_or_default();
            while how().paused {
                std::thread::sleep(Duration::from_millis(1));
            }
            let how = how();
            // SAFETY: whoever queued the work promised its pointers stay
            // valid until the stream has passed it, which is now.
            let r = unsafe { run(w, &how) };
            let mut s = self.lock();
            s.ran += 1;
            if let Err(e) = r {
                s.failed = Some(format!("emulated stream {id:#x}: {e}"));
                s.ran += s.ops.len() as u64;
                s.ops.clear();
            }
            self.moved.notify_all();
        }
    }

    fn push(&self, w: Work) -> Result<()> {
        let mut s = self.lock();
        if let Some(f) = &s.failed {
            return Err(Error::device(f.clone()));
        }
        if let Some(c) = &s.capture {
            c.lock().unwrap_or_else(|e| e.into_inner()).works.push(w);
            return Ok(());
        }
        s.ops.push_back(w);
        s.queued += 1;
        self.moved.notify_all();
        Ok(())
    }

    /// Waits until the worker has run `upto` operations, up to `limit`.
    fn reach(&self, upto: u64, limit: Option<Instant>) -> Result<()> {
        let mut s = self.lock();
        while s.ran < upto {
            let left = match limit {
                Some(t) => t.checked_duration_since(Instant::now()).ok_or_else(|| {
                    Error::device("another stream it was joined to did not finish in the time allowed")
                })?,
                None => Duration::from_secs(3600),
            };
            s = self.moved.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        match &s.failed {
            Some(f) => Err(Error::device(f.clone())),
            None => Ok(()),
        }
    }
}

/// One emulated GPU.
pub(crate) struct Emu {
    ordinal: usize,
    allocs: Mutex<BTreeMap<u64, Alloc>>,
    /// Mappings of other processes' allocations, by address: their lengths.
    imports: Mutex<HashMap<u64, usize>>,
    streams: Mutex<HashMap<u64, Arc<Lane>>>,
    how: Mutex<Emulation>,
    /// Captured graphs by id: their work.
    graphs: Mutex<HashMap<u64, Vec<Work>>>,
    /// Waits for a set bit queued since the last [`Device::emulate`].
    waits: AtomicU64,
    /// Copies and kernels queued since then.
    ops: AtomicU64,
}

impl std::fmt::Debug for Emu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.describe())
    }
}

impl Emu {
    /// The emulated device `ordinal` of this process.
    pub fn get(ordinal: usize) -> Arc<dyn Device> {
        let all = DEVICES.get_or_init(Default::default);
        let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
        let d = all.entry(ordinal).or_insert_with(|| {
            Arc::new_cyclic(|me| Emu {
                ordinal,
                allocs: Mutex::default(),
                imports: Mutex::default(),
                streams: Mutex::new(HashMap::from([(0, Lane::start(me.clone(), 0))])),
                how: Mutex::default(),
                graphs: Mutex::default(),
                waits: AtomicU64::new(0),
                ops: AtomicU64::new(0),
            })
        });
        Arc::clone(d) as Arc<dyn Device>
    }

    fn owns(&self, ptr: u64) -> bool {
        let a = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        a.range(..=ptr).next_back().is_some_and(|(&start, a)| ptr < start + a.len as u64)
    }

    fn lane(&self, stream: u64) -> Result<Arc<Lane>> {
        let s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        s.get(&stream).cloned().ok_or_else(|| {
            Error::device(format!("stream {stream:#x} is not a stream of {} (another context's?)", self.describe()))
        })
    }

    /// The error [`Emulation::fail_queue`] asks for, if this is its turn.
    fn fail_queue(&self) -> Result<()> {
        let n = self.ops.fetch_add(1, Ordering::Relaxed) + 1;
        match self.how.lock().unwrap_or_else(|e| e.into_inner()).fail_queue {
            Some(k) if k == n => Err(Error::device(format!("emulated driver error queueing copy or kernel {n}"))),
            _ => Ok(()),
        }
    }

    fn queue(&self, stream: u64, w: Work) -> Result<()> {
        self.lane(stream)?.push(w)
    }
}

impl Device for Emu {
    fn describe(&self) -> String {
        format!("emulated GPU {}", self.ordinal)
    }
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn context(&self) -> u64 {
        0xe0_0000 + self.ordinal as u64
    }
    fn memory(&self) -> usize {
        16 << 30
    }
    fn classify(&self, ptr: u64) -> Memory {
        if self.owns(ptr) {
            return Memory::Device { ordinal: self.ordinal, context: self.context() };
        }
        let others: Vec<Arc<Emu>> = DEVICES
            .get()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect())
            .unwrap_or_default();
        match others.iter().find(|d| d.ordinal != self.ordinal && d.owns(ptr)) {
            Some(d) => Memory::Device { ordinal: d.ordinal, context: d.context() },
            None => Memory::Host,
        }
    }
    fn alloc(&self, bytes: usize) -> Result<u64> {
        let len = bytes.max(1);
        let name = c"ccl-emulated-gpu";
        // SAFETY: a valid C string; the descriptor is ours until `free`.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::device(format!("memfd_create: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: the fresh descriptor is ours; a failed mapping is checked.
        let p = unsafe {
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                libc::MAP_FAILED
            } else {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
            }
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: our descriptor, closed once.
            unsafe { libc::close(fd) };
            return Err(Error::device(format!("out of memory allocating {bytes} B: {e}")));
        }
        self.allocs.lock().unwrap_or_else(|e| e.into_inner()).insert(p as u64, Alloc { len, fd });
        Ok(p as u64)
    }
    unsafe fn free(&self, ptr: u64) {
        if let Some(a) = self.allocs.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr) {
            // SAFETY: mapped in `alloc` with this length; descriptor closed once.
            unsafe {
                libc::munmap(ptr as *mut libc::c_void, a.len);
                libc::close(a.fd);
            }
        }
    }
    unsafe fn copy(&self, stream: u64, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.fail_queue()?;
        self.queue(stream, Work::Copy { dst, src, bytes })
    }
    unsafe fn launch(&self, stream: u64, k: &Kernels, l: Launch) -> Result<()> {
        k.name_of(&l)?;
        self.fail_queue()?;
        self.queue(stream, Work::Launch(Box::new(k.clone()), l))
    }
    unsafe fn write_value(&self, stream: u64, addr: u64, value: u64) -> Result<()> {
        self.queue(stream, Work::Write { addr, value })
    }
    unsafe fn wait_value(&self, stream: u64, addr: u64, until: Until) -> Result<()> {
        if let Until::SomeSet(_) = until {
            let n = self.waits.fetch_add(1, Ordering::Relaxed) + 1;
            if self.how.lock().unwrap_or_else(|e| e.into_inner()).drop_wait == Some(n) {
                return Ok(());
            }
        }
        self.queue(stream, Work::Wait { addr, until })
    }
    fn join(&self, later: u64, earlier: u64) -> Result<()> {
        let (lane, after) = (self.lane(earlier)?, self.lane(later)?);
        let (captured, upto) = {
            let s = lane.lock();
            (s.capture.clone(), s.queued)
        };
        let mut a = after.lock();
        match (captured, &a.capture) {
            // as CUDA: a stream that waits on a captured one joins its capture
            (Some(c), None) => a.capture = Some(c),
            (Some(c), Some(d)) if Arc::ptr_eq(&c, d) => {}
            (None, None) => {
                drop(a);
                return after.push(Work::After { lane, upto });
            }
            _ => {
                return Err(Error::device(format!(
                    "stream {later:#x} is being captured and cannot wait for work outside its capture"
                )))
            }
        }
        Ok(())
    }
    fn idle(&self, stream: u64) -> Result<bool> {
        let lane = self.lane(stream)?;
        let s = lane.lock();
        match (&s.failed, &s.capture) {
            (Some(f), _) => Err(Error::device(f.clone())),
            (None, Some(_)) => Err(captured(stream, "query")),
            (None, None) => Ok(s.ran >= s.queued),
        }
    }
    fn sync(&self, stream: u64) -> Result<()> {
        let lane = self.lane(stream)?;
        let upto = {
            let s = lane.lock();
            if s.capture.is_some() {
                return Err(captured(stream, "synchronise"));
            }
            s.queued
        };
        lane.reach(upto, None)
    }
    fn begin_capture(&self, stream: u64) -> Result<()> {
        let lane = self.lane(stream)?;
        let mut s = lane.lock();
        if s.capture.is_some() {
            return Err(Error::device(format!("stream {stream:#x} is already being captured")));
        }
        s.capture = Some(Arc::new(Mutex::new(Capture { origin: stream, works: Vec::new() })));
        Ok(())
    }
    fn end_capture(&self, stream: u64) -> Result<u64> {
        let c = self.lane(stream)?.lock().capture.clone();
        let c = c
            .filter(|c| c.lock().unwrap_or_else(|e| e.into_inner()).origin == stream)
            .ok_or_else(|| Error::device(format!("stream {stream:#x} is not where a capture began")))?;
        for lane in self.streams.lock().unwrap_or_else(|e| e.into_inner()).values() {
            let mut s = lane.lock();
            if s.capture.as_ref().is_some_and(|d| Arc::ptr_eq(&c, d)) {
                s.capture = None;
            }
        }
        let works = std::mem::take(&mut c.lock().unwrap_or_else(|e| e.into_inner()).works);
        let id = STREAMS.fetch_add(1, Ordering::Relaxed);
        self.graphs.lock().unwrap_or_else(|e| e.into_inner()).insert(id, works);
        Ok(id)
    }
    fn capturing(&self, stream: u64) -> Result<bool> {
        Ok(self.lane(stream)?.lock().capture.is_some())
    }
    fn launch_graph(&self, graph: u64, stream: u64) -> Result<()> {
        let works = self.graphs.lock().unwrap_or_else(|e| e.into_inner()).get(&graph).cloned();
        let works = works.ok_or_else(|| Error::device(format!("{graph:#x} is not a graph of {}", self.describe())))?;
        let lane = self.lane(stream)?;
        works.into_iter().try_for_each(|w| lane.push(w))
    }
    fn drop_graph(&self, graph: u64) {
        self.graphs.lock().unwrap_or_else(|e| e.into_inner()).remove(&graph);
    }
    fn read_word(&self, addr: u64) -> Result<u64> {
        // SAFETY: per the callers, an aligned flag word of live device
        // memory (host memory here), read atomically.
        Ok(unsafe { AtomicU64::from_ptr(addr as *mut u64) }.load(Ordering::Acquire))
    }
    unsafe fn write_word(&self, addr: u64, value: u64) -> Result<()> {
        // SAFETY: per the contract, an aligned, live word.
        unsafe { AtomicU64::from_ptr(addr as *mut u64) }.store(value, Ordering::Release);
        Ok(())
    }
    fn reach(&self, owner: &dyn Device) -> Result<()> {
        if owner.context() != self.context() && self.how.lock().unwrap_or_else(|e| e.into_inner()).no_peer {
            return Err(super::no_peer_access(self, owner));
        }
        Ok(())
    }
    fn emulate(&self, how: Emulation) -> Result<()> {
        *self.how.lock().unwrap_or_else(|e| e.into_inner()) = how;
        self.waits.store(0, Ordering::Relaxed);
        self.ops.store(0, Ordering::Relaxed);
        Ok(())
    }
    fn new_stream(&self) -> Result<u64> {
        let id = STREAMS.fetch_add(1, Ordering::Relaxed);
        let me = DEVICES
            .get()
            .and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).get(&self.ordinal).map(Arc::downgrade))
            .unwrap_or_default();
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Lane::start(me, id));
        Ok(id)
    }
    fn stream_context(&self, stream: u64) -> Result<u64> {
        self.lane(stream).map(|_| self.context())
    }
    fn drop_stream(&self, stream: u64) {
        if stream != 0 {
            if let Some(lane) = self.streams.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream) {
                lane.lock().closed = true;
                lane.moved.notify_all();
            }
        }
    }
    unsafe fn pin(&self, _ptr: *mut u8, _bytes: usize) -> Result<()> {
        Ok(())
    }
    unsafe fn unpin(&self, _ptr: *mut u8) {}
    fn export(&self, ptr: u64) -> Result<[u8; 64]> {
        let a = self.allocs.lock().unwrap_or_else(|e| e.into_inner()).get(&ptr).copied();
        let a = a.ok_or_else(|| Error::device(format!("{ptr:#x} is not an allocation of {}", self.describe())))?;
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        h[12..16].copy_from_slice(&a.fd.to_le_bytes());
        h[16..24].copy_from_slice(&(a.len as u64).to_le_bytes());
        Ok(h)
    }
    fn import(&self, h: &[u8; 64]) -> Result<u64> {
        let word = |i: usize| [h[i], h[i + 1], h[i + 2], h[i + 3]];
        let (pid, fd) = (u32::from_le_bytes(word(8)), i32::from_le_bytes(word(12)));
        let len = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default()) as usize;
        if &h[..8] != MAGIC || len == 0 {
            return Err(Error::device("not an emulated GPU's memory handle"));
        }
        let path = format!("/proc/{pid}/fd/{fd}");
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
            // a process that has exited (a zombie until reaped) keeps no descriptors
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let gone = stat.rsplit(')').next().is_none_or(|s| s.trim_start().starts_with(['Z', 'X']));
            let why = if gone { format!("process {pid}, which exported it, has exited") } else { e.to_string() };
            Error::device(format!("cannot map another process's emulated GPU memory ({path}): {why}"))
        })?;
        // SAFETY: a shared mapping of the exporter's memfd; checked below.
        let p = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::device(format!("mapping {path}: {}", std::io::Error::last_os_error())));
        }
        self.imports.lock().unwrap_or_else(|e| e.into_inner()).insert(p as u64, len);
        Ok(p as u64)
    }
    unsafe fn unimport(&self, ptr: u64) {
        if let Some(len) = self.imports.lock().unwrap_or_else(|e| e.into_inner()).remove(&ptr) {
            // SAFETY: mapped by `import` with this length, unmapped once.
            unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
        }
    }
}

/// What a stream being captured answers a call that needs it to run.
fn captured(stream: u64, what: &str) -> Error {
    Error::device(format!("stream {stream:#x} is being captured into a graph: cannot {what} it until the capture ends"))
}

/// Runs one queued piece of work.
///
/// # Safety
/// Its pointers are valid for it.
unsafe fn run(w: Work, how: &Emulation) -> std::result::Result<(), String> {
    if matches!(w, Work::Copy { .. } | Work::Launch(..)) && !how.delay.is_zero() {
        std::thread::sleep(how.delay);
    }
    // SAFETY: forwarded from the queuing call's contract.
    unsafe {
        match w {
            Work::Copy { dst, src, bytes } => std::ptr::copy(src as *const u8, dst as *mut u8, bytes),
            Work::Launch(k, Launch::Reduce { dst, a, b, n }) => (k.host_reduce)(dst as _, a as _, b as _, n),
            Work::Launch(k, Launch::RecvReduceSend { out, next, slot, local, n }) => {
                let first = if out != 0 { out } else { next };
                (k.host_reduce)(first as _, slot as _, local as _, n);
                if out != 0 && next != 0 {
                    std::ptr::copy_nonoverlapping(out as *const u8, next as *mut u8, n * k.elem);
                }
            }
            Work::Launch(k, Launch::Div { buf, ranks, n }) => (k.host_finish)(buf as _, n, ranks),
            Work::Write { addr, value } => AtomicU64::from_ptr(addr as *mut u64).store(value, Ordering::Release),
            Work::Wait { addr, until } => {
                let word = AtomicU64::from_ptr(addr as *mut u64);
                let limit = if how.wait_limit.is_zero() { WAIT_LIMIT } else { how.wait_limit };
                let start = Instant::now();
                let mut spins = 0u32;
                while !until.met(word.load(Ordering::Acquire)) {
                    if start.elapsed() > limit {
                        return Err(format!(
                            "waited {limit:?} for the flag at {addr:#x} to meet {until:?} (it holds {}): \
                             a flag never written, or a peer that never queued its part",
                            word.load(Ordering::Acquire)
                        ));
                    }
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else if spins < 256 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            }
            Work::After { lane, upto } => {
                let limit = if how.wait_limit.is_zero() { WAIT_LIMIT } else { how.wait_limit };
                lane.reach(upto, Some(Instant::now() + limit)).map_err(|e| e.to_string())?
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed 64-bit flag in device memory of `d`.
    fn flag(d: &Arc<dyn Device>) -> u64 {
        let f = d.alloc(64).expect("alloc");
        // SAFETY: a fresh, aligned allocation nothing has queued work on.
        unsafe { d.write_word(f, 0) }.expect("zero");
        f
    }

    #[test]
    fn a_wait_blocks_only_its_stream_and_a_write_releases_it() {
        let d = Emu::get(90);
        let (a, b) = (d.new_stream().expect("stream"), d.new_stream().expect("stream"));
        let (f, mem, other) = (flag(&d), d.alloc(8).expect("alloc"), d.alloc(8).expect("alloc"));
        let src = 7u64;
        // SAFETY: the flag, `mem` and `other` live until the end; `src` too.
        unsafe {
            d.wait_value(a, f, Until::AtLeast(1)).expect("wait");
            d.copy(a, mem, &src as *const u64 as u64, 8).expect("copy");
            d.copy(b, other, &src as *const u64 as u64, 8).expect("copy");
        }
        d.sync(b).expect("stream b runs while a waits");
        assert_eq!(d.read_word(other).expect("read"), 7);
        assert!(!d.idle(a).expect("idle"), "a waits for the flag");
        // SAFETY: as above; b writes the flag a waits for
        unsafe { d.write_value(b, f, 1) }.expect("write");
        d.sync(a).expect("a released by b's write");
        assert_eq!(d.read_word(mem).expect("read"), 7);
    }

    #[test]
    fn a_flag_never_written_fails_the_stream_within_its_limit_and_stays_failed() {
        let d = Emu::get(91);
        d.emulate(Emulation { wait_limit: Duration::from_millis(100), ..Emulation::default() }).expect("emulate");
        let s = d.new_stream().expect("stream");
        let f = flag(&d);
        // SAFETY: the flag lives until the end.
        unsafe { d.wait_value(s, f, Until::SomeSet(3)) }.expect("wait");
        let e = d.sync(s).expect_err("must fail");
        assert!(e.to_string().contains("to meet SomeSet(3) (it holds 0)"), "{e}");
        assert!(d.sync(s).is_err() && d.idle(s).is_err(), "a failed stream stays failed");
        // SAFETY: as above.
        assert!(unsafe { d.write_value(s, f, 1) }.is_err(), "nothing more is queued on it");
    }

    #[test]
    fn a_joined_stream_waits_for_what_was_queued_before_the_join() {
        let d = Emu::get(92);
        let (a, b) = (d.new_stream().expect("stream"), d.new_stream().expect("stream"));
        let (f, g) = (flag(&d), flag(&d));
        // SAFETY: the flags live until the end.
        unsafe {
            d.wait_value(a, f, Until::AtLeast(1)).expect("wait");
            d.join(b, a).expect("join");
            d.write_value(b, g, 5).expect("write");
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(d.read_word(g).expect("read"), 0, "b is held behind a");
        // SAFETY: as above.
        unsafe { d.write_word(f, 1) }.expect("release");
        d.sync(b).expect("sync");
        assert_eq!(d.read_word(g).expect("read"), 5);
    }
}
