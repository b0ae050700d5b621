//! GPU buffers in the same collectives (feature `cuda` for real GPUs).
//!
//! A [`DeviceBuffer<T>`] is accepted wherever a collective takes a buffer:
//! `comm.all_reduce(&mut dev_buf, Sum)` runs the same schedule (ring,
//! tree, recursive doubling, …) as for host memory, with every copy and
//! every reduction done on the GPU by ccl's kernels (`kernels/cuda`,
//! compiled by NVRTC for the device's architecture; derived structs get
//! kernels generated from `#[derive(Reduce)]`). Data never goes to the
//! host to be reduced.
//!
//! # Semantics: streams and what blocks
//!
//! Every device buffer belongs to a [`Stream`] (the one it was made on, or
//! [`DeviceBuffer::set_stream`]). A collective on device buffers, as
//! `ncclAllReduce` does:
//! - queues all its copies, kernels and hand-offs on the output buffer's
//!   stream, after the work already queued there, and **returns without
//!   waiting for the GPU**: work queued on that stream afterwards sees the
//!   result; to see it from the host, call [`Stream::synchronize`] (or
//!   copy the buffer out: [`DeviceBuffer::to_vec`] synchronises). The
//!   buffers must stay alive and untouched by other streams until then.
//! - waits on the host only for its peers' hosts: each connection carries
//!   one message per call (its fingerprint), so the call returns once the
//!   ranks it receives from have made the same call, and fails, as host
//!   calls do, when they made another or are gone.
//! - runs after the communicator's previous device call on the GPU, even
//!   one on another stream (the streams are joined by an event).
//! - The input buffer must be on the same GPU and context as the output.
//! - Errors met after the call returned surface at the next
//!   synchronisation of the stream: a peer lost while the GPU waits on
//!   it (a thread of ccl's watches every call in flight and releases its
//!   waits, so the stream ends, with wrong data, rather than hang; also
//!   after `CCL_TIMEOUT`), any failure of a call the proxy thread
//!   finishes (below), or, on the emulator, a flag that never came.
//!
//! A call queued while its stream is being captured (a CUDA graph: see
//! [`Graph`]) is recorded, and runs anew at each launch of the graph.
//!
//! Calls over a staged (tcp) connection return as soon, though their bytes
//! must pass through the host: such a call queues on the caller's stream
//! only "the call starts here" and "wait until it is done" (two words the
//! streams write and await), and the communicator's proxy thread queues
//! its work on the channels' streams as the peers' messages come, posting
//! each host slot once its stream has copied it. Every later device call
//! of that communicator goes through the proxy too, in order; such calls
//! cannot be captured into a graph.
//!
//! # How bytes move
//!
//! Slots work as for host memory (a FIFO per connection), but a slot's
//! bytes live in device memory of the sender, and within a host the
//! hand-off happens on the GPUs: each slot has a flag, empty or full; the
//! sender's stream waits (`cuStreamWaitValue64`) for it to be empty,
//! fills the slot and sets it full (`cuStreamWriteValue64`); the
//! receiver's stream waits for full, reads the slot with its kernels and
//! sets it empty. A call leaves every flag as it found it. The receiver
//! maps the sender's slots and flags through CUDA
//! IPC (once per connection; several ranks may share one GPU); threads of
//! one process share the pointer. Across hosts (the tcp transport) slots
//! are staged through host memory: the sender's stream copies its device
//! slot into the socket's staging slot, which the proxy posts once the
//! stream has run the copy; the receiver's stream copies it into a device
//! slot, and the kernels reduce there.
//!
//! # Without a GPU
//!
//! Built without feature `cuda`, or run without the CUDA driver, [`Gpu::open`]
//! returns an [`ErrorKind::Device`](crate::ErrorKind::Device) error and
//! nothing else changes. Tests run the whole device path on an emulated
//! device ([`Gpu::emulated`]): "device" memory in host RAM (memfds, which
//! other processes map by IPC handle), each stream a thread that runs its
//! copies, kernels (on the CPU) and flag operations in order, concurrently
//! with the host and the other streams, so a missing wait shows up as
//! wrong data and a missing flag as a reported deadlock.

mod buffer;
#[cfg(feature = "cuda")]
mod cuda;
mod emu;
mod graph;
mod kernels;
mod place;
pub(crate) mod watch;

pub use buffer::{DeviceBuffer, Gpu, Stream};
pub use ccl_kernels::cuda::codegen;
pub use graph::Graph;
pub use kernels::Kernels;
pub(crate) use place::GpuBinding;
#[doc(hidden)]
pub use place::Place;

use crate::error::Result;

/// Where a pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (or memory this device cannot name).
    Host,
    /// Memory of GPU `ordinal` in context `context`.
    Device {
        /// The device's ordinal.
        ordinal: usize,
        /// The context's identity.
        context: u64,
    },
}

/// One kernel launch on device pointers (element counts, not bytes).
#[derive(Clone, Copy, Debug)]
pub enum Launch {
    /// `dst = a ⊕ b`; `dst` may be `a` or `b`.
    Reduce {
        /// Result.
        dst: u64,
        /// First operand.
        a: u64,
        /// Second operand.
        b: u64,
        /// Elements.
        n: usize,
    },
    /// `v = slot ⊕ local`, written to `out` and `next` (either may be 0).
    RecvReduceSend {
        /// The output region, or 0.
        out: u64,
        /// The next slot, or 0.
        next: u64,
        /// The arrived slot.
        slot: u64,
        /// Local data.
        local: u64,
        /// Elements.
        n: usize,
    },
    /// `buf /= ranks` (Avg's finishing pass).
    Div {
        /// The buffer.
        buf: u64,
        /// The rank count.
        ranks: usize,
        /// Elements.
        n: usize,
    },
}

/// The error for a device that cannot reach `owner`'s memory.
fn no_peer_access(dev: &dyn Device, owner: &dyn Device) -> crate::error::Error {
    crate::error::Error::device(format!(
        "{} cannot reach the memory of {} (no peer access between them): ranks that are threads of one \
         process need GPUs with peer access (NVLink or PCIe P2P); else run one process per GPU",
        dev.describe(),
        owner.describe()
    ))
}

/// What a stream waits for a word to meet ([`Device::wait_value`]), as
/// `cuStreamWaitValue64` can test it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// At least this value, as `CU_STREAM_WAIT_VALUE_GEQ` compares: the
    /// difference taken as signed (so counts may wrap).
    AtLeast(u64),
    /// Some bit of this mask set (`CU_STREAM_WAIT_VALUE_AND`).
    SomeSet(u64),
    /// Some bit of this mask clear (`CU_STREAM_WAIT_VALUE_NOR` of its complement).
    SomeClear(u64),
}

impl Until {
    /// Whether `word` meets it.
    pub fn met(self, word: u64) -> bool {
        match self {
            Until::AtLeast(v) => word.wrapping_sub(v) as i64 >= 0,
            Until::SomeSet(m) => word & m != 0,
            Until::SomeClear(m) => word & m != m,
        }
    }
}

/// How an emulated device misbehaves, for tests that show what a missing
/// wait or flag does ([`Gpu::emulate`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Emulation {
    /// Sleep before each copy and kernel: a slow device.
    pub delay: std::time::Duration,
    /// How long a stream waits on a flag before it fails (0: a minute).
    pub wait_limit: std::time::Duration,
    /// Drops the `n`th wait (from 1) for a word to have some bit set
    /// ([`Until::SomeSet`]: a receiver's wait for a full slot) queued on
    /// this device from now on.
    pub drop_wait: Option<u64>,
    /// Has no peer access to other emulated GPUs' memory.
    pub no_peer: bool,
    /// The `n`th copy or kernel queued from now on (from 1) fails, as a
    /// driver error would, leaving what was queued before it.
    pub fail_queue: Option<u64>,
    /// Its streams start nothing while set (a GPU busy elsewhere).
    pub paused: bool,
}

/// What ccl needs from a GPU: memory, copies, kernels, streams, IPC.
/// Implemented over the CUDA driver (feature `cuda`) and by an emulation
/// for tests. Pointers are device addresses (`CUdeviceptr`); with unified
/// addressing host pointers are valid addresses too.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// `"GPU 0 (NVIDIA H200, sm_90)"`.
    fn describe(&self) -> String;
    /// The device's ordinal.
    fn ordinal(&self) -> usize;
    /// The identity of the context ccl uses on it.
    fn context(&self) -> u64;
    /// Bytes of memory it has.
    fn memory(&self) -> usize;
    /// What `ptr` points to.
    fn classify(&self, ptr: u64) -> Memory;
    /// Allocates `bytes` (at least 1) of device memory.
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// Frees memory from [`alloc`](Self::alloc).
    ///
    /// # Safety
    /// `ptr` came from `alloc` of this device and is not used afterwards.
    unsafe fn free(&self, ptr: u64);
    /// Queues a copy of `bytes` from `src` to `dst` (device or host addresses) on `stream`.
    ///
    /// # Safety
    /// Both ranges are valid for the copy until the stream has passed it.
    unsafe fn copy(&self, stream: u64, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Queues a kernel of `k` on `stream`.
    ///
    /// # Safety
    /// Every pointer in `l` is valid for `n` elements of `k`'s type until the stream has passed it.
    unsafe fn launch(&self, stream: u64, k: &Kernels, l: Launch) -> Result<()>;
    /// Queues on `stream`: once the work before it has run and its writes
    /// are visible to other devices and processes, stores `value` in the
    /// 64-bit word at `addr` (device memory, or memory mapped from another
    /// process's device by [`import`](Self::import)).
    ///
    /// # Safety
    /// `addr` is valid and 8-byte aligned until the stream has passed it.
    unsafe fn write_value(&self, stream: u64, addr: u64, value: u64) -> Result<()>;
    /// Queues on `stream`: nothing queued after it starts until the 64-bit
    /// word at `addr` meets `until`. Other streams and the host go on
    /// meanwhile.
    ///
    /// # Safety
    /// As [`write_value`](Self::write_value).
    unsafe fn wait_value(&self, stream: u64, addr: u64, until: Until) -> Result<()>;
    /// Orders the work queued on `later` from now on after everything
    /// queued on `earlier` so far (an event recorded on one, awaited on the
    /// other); neither waits on the host.
    fn join(&self, later: u64, earlier: u64) -> Result<()>;
    /// Whether everything queued on `stream` has run, without waiting.
    fn idle(&self, stream: u64) -> Result<bool>;
    /// Waits until everything queued on `stream` has run.
    fn sync(&self, stream: u64) -> Result<()>;
    /// Starts capturing the work queued on `stream` (and on streams that
    /// join it) into a graph instead of running it (relaxed mode).
    fn begin_capture(&self, stream: u64) -> Result<()>;
    /// Ends the capture begun on `stream`: the graph, ready to launch.
    fn end_capture(&self, stream: u64) -> Result<u64>;
    /// Whether `stream` is being captured.
    fn capturing(&self, stream: u64) -> Result<bool>;
    /// Queues a run of `graph` on `stream`.
    fn launch_graph(&self, graph: u64, stream: u64) -> Result<()>;
    /// Destroys a graph from [`end_capture`](Self::end_capture).
    fn drop_graph(&self, graph: u64);
    /// Reads the 64-bit word at device address `addr` now (a flag), waiting
    /// for no stream.
    fn read_word(&self, addr: u64) -> Result<u64>;
    /// Stores `value` in the 64-bit word at device address `addr` now,
    /// waiting for no stream: how flags start at 0, and how the host
    /// releases waits on them when a peer is lost.
    ///
    /// # Safety
    /// `addr` is valid and 8-byte aligned.
    unsafe fn write_word(&self, addr: u64, value: u64) -> Result<()>;
    /// Lets this device's streams and kernels read and write memory of
    /// `owner` (peer access, enabled once); an error where they cannot.
    fn reach(&self, owner: &dyn Device) -> Result<()>;
    /// Makes an emulated device misbehave as a test asks; an error for a real one.
    #[doc(hidden)]
    fn emulate(&self, _how: Emulation) -> Result<()> {
        Err(crate::error::Error::device(format!("{} is not emulated", self.describe())))
    }
    /// A new stream.
    fn new_stream(&self) -> Result<u64>;
    /// The context `stream` belongs to.
    fn stream_context(&self, stream: u64) -> Result<u64>;
    /// Destroys a stream from [`new_stream`](Self::new_stream).
    fn drop_stream(&self, stream: u64);
    /// Page-locks host memory so copies to and from it run at full speed
    /// (staging slots); an error leaves it pageable, which still works.
    ///
    /// # Safety
    /// The range stays allocated until [`unpin`](Self::unpin).
    unsafe fn pin(&self, ptr: *mut u8, bytes: usize) -> Result<()>;
    /// Undoes [`pin`](Self::pin).
    ///
    /// # Safety
    /// `ptr` was pinned by `pin` and is still allocated.
    unsafe fn unpin(&self, ptr: *mut u8);
    /// A handle by which another process on this host maps the allocation `ptr`.
    fn export(&self, ptr: u64) -> Result<[u8; 64]>;
    /// Maps an allocation exported by another process of this host.
    fn import(&self, handle: &[u8; 64]) -> Result<u64>;
    /// Unmaps what [`import`](Self::import) mapped.
    ///
    /// # Safety
    /// `ptr` came from `import` and is not used afterwards.
    unsafe fn unimport(&self, ptr: u64);
}
