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
//! [`DeviceBuffer::set_stream`]). A collective on device buffers:
//! - is ordered after all work queued before it on the output buffer's
//!   stream (its copies and kernels go on that stream), and work queued on
//!   that stream after it returns sees its result;
//! - **blocks the calling thread** until the result is in the output buffer:
//!   the host drives the schedule and synchronises the stream before it
//!   hands a slot to a peer, so when the call returns the stream is idle
//!   up to the end of the collective. (A call therefore also waits for
//!   earlier work on that stream.) Other streams are not touched.
//! - The input buffer must be on the same GPU and context as the output.
//!
//! # How bytes move
//!
//! Slots work as for host memory (a FIFO per connection, its control words
//! in host memory), but a slot's bytes live in device memory of the
//! sender: inside a host the receiver maps the sender's slots through CUDA
//! IPC (once per connection; several ranks may share one GPU) and its
//! kernels read them there; threads of one process share the pointer.
//! Across hosts (the tcp transport) slots are staged through host memory:
//! the sender copies its device slot into the socket's staging slot, the
//! receiver copies it into a device slot, and the kernels reduce there.
//!
//! # Without a GPU
//!
//! Built without feature `cuda`, or run without the CUDA driver, [`Gpu::open`]
//! returns an [`ErrorKind::Device`](crate::ErrorKind::Device) error and
//! nothing else changes. Tests run the whole device path on an emulated
//! device ([`Gpu::emulated`]): "device" memory in host RAM (memfds, which
//! other processes map by IPC handle), kernels run on the CPU only when
//! the stream is synchronised, so a missing synchronisation shows up as
//! wrong data.

mod buffer;
#[cfg(feature = "cuda")]
mod cuda;
mod emu;
mod kernels;
mod place;

pub use buffer::{DeviceBuffer, Gpu, Stream};
pub use ccl_kernels::cuda::codegen;
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
    /// Waits until everything queued on `stream` has run.
    fn sync(&self, stream: u64) -> Result<()>;
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
