//! An emulated GPU for tests without one: device memory is host memory
//! that this module hands out and recognises, streams are queues that run
//! only when synchronised (so a copy or kernel the caller forgot to wait
//! for has not happened yet, as on a GPU), and kernels run as the host
//! functions of [`Kernels`]. Each allocation is a memfd mapped shared,
//! so an IPC handle (process id, descriptor, length) lets another process
//! of this host map it through `/proc/<pid>/fd/<fd>`, the way ranks that
//! share a GPU map each other's memory with CUDA IPC.

use super::{Device, Kernels, Launch, Memory};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Emulated devices by ordinal.
static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Emu>>>> = OnceLock::new();
/// Stream ids, unique across devices (0 is no stream).
static STREAMS: AtomicU64 = AtomicU64::new(1);
const MAGIC: &[u8; 8] = b"ccl-emu\0";

/// One allocation: its length and the memfd behind it.
#[derive(Clone, Copy)]
struct Alloc {
    len: usize,
    fd: i32,
}

enum Work {
    Copy { dst: u64, src: u64, bytes: usize },
    Launch(Box<Kernels>, Launch),
}

/// One emulated GPU.
pub(crate) struct Emu {
    ordinal: usize,
    allocs: Mutex<BTreeMap<u64, Alloc>>,
    /// Mappings of other processes' allocations, by address: their lengths.
    imports: Mutex<HashMap<u64, usize>>,
    streams: Mutex<HashMap<u64, Vec<Work>>>,
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
            let streams = Mutex::new(HashMap::from([(0, Vec::new())]));
            Arc::new(Emu { ordinal, allocs: Mutex::default(), imports: Mutex::default(), streams })
        });
        Arc::clone(d) as Arc<dyn Device>
    }

    fn owns(&self, ptr: u64) -> bool {
        let a = self.allocs.lock().unwrap_or_else(|e| e.into_inner());
        a.range(..=ptr).next_back().is_some_and(|(&start, a)| ptr < start + a.len as u64)
    }

    fn queue(&self, stream: u64, w: Work) -> Result<()> {
        let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let q = s
            .get_mut(&stream)
            .ok_or_else(|| Error::device(format!("stream {stream:#x} is not a stream of {}", self.describe())))?;
        q.push(w);
        Ok(())
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
        self.queue(stream, Work::Copy { dst, src, bytes })
    }
    unsafe fn launch(&self, stream: u64, k: &Kernels, l: Launch) -> Result<()> {
        k.name_of(&l)?;
        self.queue(stream, Work::Launch(Box::new(k.clone()), l))
    }
    fn sync(&self, stream: u64) -> Result<()> {
        let work = {
            let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            let q = s
                .get_mut(&stream)
                .ok_or_else(|| Error::device(format!("stream {stream:#x} is not a stream of {}", self.describe())))?;
            std::mem::take(q)
        };
        for w in work {
            // SAFETY: whoever queued the work promised its pointers stay valid
            // until the stream has passed it, which is now.
            unsafe { run(w) };
        }
        Ok(())
    }
    fn new_stream(&self) -> Result<u64> {
        let id = STREAMS.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Vec::new());
        Ok(id)
    }
    fn stream_context(&self, stream: u64) -> Result<u64> {
        if self.streams.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&stream) {
            Ok(self.context())
        } else {
            Err(Error::device(format!(
                "stream {stream:#x} is not a stream of {} (another context's?)",
                self.describe()
            )))
        }
    }
    fn drop_stream(&self, stream: u64) {
        if stream != 0 {
            self.streams.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream);
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
        let f =
            std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
                Error::device(format!("cannot map another process's emulated GPU memory ({path}): {e}"))
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

/// Runs one queued piece of work.
///
/// # Safety
/// Its pointers are valid for it.
unsafe fn run(w: Work) {
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
        }
    }
}
