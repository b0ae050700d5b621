//! [`Gpu`], [`Stream`] and [`DeviceBuffer`]: the handles users hold.

use super::{Device, Memory};
use crate::error::{Error, Result};
use crate::Reduce;
use std::marker::PhantomData;
use std::sync::Arc;

/// One GPU as ccl uses it: open it, make streams, allocate buffers.
#[derive(Clone, Debug)]
pub struct Gpu {
    pub(crate) dev: Arc<dyn Device>,
}

impl Gpu {
    /// GPU `ordinal` through the CUDA driver (its primary context). An
    /// [`ErrorKind::Device`](crate::ErrorKind::Device) error — never a panic —
    /// when ccl was built without feature `cuda`, the driver
    /// (`libcuda.so.1`) is missing, or there is no such GPU.
    pub fn open(ordinal: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            Ok(Gpu { dev: super::cuda::Cuda::open(ordinal)? })
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(Error::device(format!("cannot open GPU {ordinal}: ccl was built without feature `cuda`")))
        }
    }

    /// GPU `local_rank % count` of this host's GPUs: how ranks sharing a
    /// host spread over its GPUs (and share them when there are fewer).
    pub fn for_local_rank(local_rank: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            let n = super::cuda::Cuda::count()?;
            Self::open(local_rank % n.max(1))
        }
        #[cfg(not(feature = "cuda"))]
        {
            Self::open(local_rank)
        }
    }

    /// This rank's GPU in `group`: [`for_local_rank`](Self::for_local_rank)
    /// of its position among the group's ranks on its host.
    pub fn for_rank(group: &crate::Group) -> Result<Self> {
        let (hosts, me) = (group.hosts(), group.rank());
        let local = hosts.groups().get(hosts.host_of(me)).and_then(|g| g.iter().position(|&r| r == me)).unwrap_or(0);
        Self::for_local_rank(local)
    }

    /// An emulated GPU for tests: "device" memory is host memory that only
    /// this device's calls may touch, and each stream is a thread that runs
    /// its queued work in order, as the GPU would. Handles with the same
    /// `ordinal` made in one process are one device (one context), like
    /// ranks sharing a GPU.
    #[doc(hidden)]
    pub fn emulated(ordinal: usize) -> Self {
        Gpu { dev: super::emu::Emu::get(ordinal) }
    }

    /// Makes an emulated GPU misbehave as a test asks (see [`Emulation`](super::Emulation));
    /// an error on a real one.
    #[doc(hidden)]
    pub fn emulate(&self, how: super::Emulation) -> Result<()> {
        self.dev.emulate(how)
    }

    /// What this GPU is.
    pub fn describe(&self) -> String {
        self.dev.describe()
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal()
    }

    /// A new stream on this GPU.
    pub fn stream(&self) -> Result<Stream> {
        Ok(Stream::new(Arc::clone(&self.dev), self.dev.new_stream()?, true))
    }

    /// A stream ccl does not own (a `CUstream` of the caller's, from
    /// cudarc's `CudaStream::cu_stream()`).
    ///
    /// # Safety
    /// `raw` is a live stream and outlives the returned handle and every
    /// buffer set to it.
    pub unsafe fn wrap_stream(&self, raw: u64) -> Stream {
        Stream::new(Arc::clone(&self.dev), raw, false)
    }

    /// `len` zeroed elements of device memory, on `stream`.
    pub fn alloc<T: Reduce>(&self, len: usize, stream: &Stream) -> Result<DeviceBuffer<T>> {
        self.same(stream)?;
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| Error::device("allocation too large"))?;
        let ptr = self.dev.alloc(bytes.max(1))?;
        let buf = DeviceBuffer { stream: stream.clone(), ptr, len, owned: true, _t: PhantomData };
        let zeros = vec![0u8; bytes];
        // SAFETY: `ptr` has `bytes` bytes; `zeros` lives until the sync below.
        unsafe { self.dev.copy(stream.raw(), ptr, zeros.as_ptr() as u64, bytes)? };
        self.dev.sync(stream.raw())?;
        Ok(buf)
    }

    /// A device buffer holding a copy of `data`, on `stream`.
    pub fn upload<T: Reduce>(&self, data: &[T], stream: &Stream) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc(data.len(), stream)?;
        b.copy_from_host(data)?;
        Ok(b)
    }

    fn same(&self, stream: &Stream) -> Result<()> {
        if stream.dev().context() != self.dev.context()
            || stream.dev().stream_context(stream.raw())? != self.dev.context()
        {
            return Err(Error::device(format!(
                "the stream belongs to {}, not to {}",
                stream.dev().describe(),
                self.dev.describe()
            )));
        }
        Ok(())
    }
}

/// A stream of one GPU: work on it runs in order. Clones are handles on
/// the same stream; a stream ccl made is destroyed with the last of them.
#[derive(Clone, Debug)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

#[derive(Debug)]
struct StreamInner {
    dev: Arc<dyn Device>,
    raw: u64,
    owned: bool,
}

impl Stream {
    fn new(dev: Arc<dyn Device>, raw: u64, owned: bool) -> Self {
        Stream { inner: Arc::new(StreamInner { dev, raw, owned }) }
    }

    /// Waits for everything queued on this stream; an error the stream
    /// met, or why ccl released the waits of a collective queued on it (a
    /// peer lost while the GPU waited on it: its results are wrong).
    pub fn synchronize(&self) -> Result<()> {
        self.inner.dev.sync(self.inner.raw)?;
        super::watch::failure(self).map_or(Ok(()), Err)
    }

    /// Whether everything queued on this stream has run, without waiting
    /// (`cuStreamQuery`); an error the stream met.
    pub fn query(&self) -> Result<bool> {
        self.inner.dev.idle(self.inner.raw)
    }

    /// The raw `CUstream`.
    pub fn raw(&self) -> u64 {
        self.inner.raw
    }

    pub(crate) fn dev(&self) -> &Arc<dyn Device> {
        &self.inner.dev
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.dev.sync(self.raw);
            self.dev.drop_stream(self.raw);
        }
    }
}

/// `len` elements of `T` in device memory, on a stream. Collectives take it
/// where they take a slice; see the [module docs](crate::gpu) for ordering.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    pub(crate) stream: Stream,
    pub(crate) ptr: u64,
    len: usize,
    owned: bool,
    _t: PhantomData<T>,
}

impl<T: Reduce> DeviceBuffer<T> {
    /// A buffer over device memory ccl does not own (a cudarc `CudaSlice`'s
    /// `device_ptr`, a framework's tensor). Collectives check that `ptr` is
    /// device memory of the stream's GPU and context.
    ///
    /// # Safety
    /// `ptr` is valid for `len` elements of `T` for the life of the buffer.
    pub unsafe fn from_raw(ptr: u64, len: usize, stream: &Stream) -> Self {
        DeviceBuffer { stream: stream.clone(), ptr, len, owned: false, _t: PhantomData }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The stream collectives on this buffer are ordered on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Orders later collectives on this buffer on `stream` instead
    /// (the same GPU and context, else an error).
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        Gpu { dev: Arc::clone(self.stream.dev()) }.same(stream)?;
        self.stream = stream.clone();
        Ok(())
    }

    /// Queues a copy of `src` (the same length, GPU and context) into this
    /// buffer on this buffer's stream, after the work queued on either
    /// buffer's stream, and returns without waiting for it.
    pub fn copy_from(&mut self, src: &DeviceBuffer<T>) -> Result<()> {
        self.check_len(src.len)?;
        let dev = Arc::clone(self.stream.dev());
        Gpu { dev: Arc::clone(&dev) }.same(&src.stream)?;
        if src.stream.raw() != self.stream.raw() {
            dev.join(self.stream.raw(), src.stream.raw())?;
        }
        let bytes = self.len * std::mem::size_of::<T>();
        // SAFETY: both buffers hold `bytes` bytes of this device's memory
        // and stay allocated until their streams have passed the copy (a
        // buffer's drop synchronises its stream first).
        unsafe { dev.copy(self.stream.raw(), self.ptr, src.ptr, bytes) }
    }

    /// Copies `data` in (same length), waiting for the copy.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        self.check_len(data.len())?;
        let bytes = std::mem::size_of_val(data);
        // SAFETY: both ranges hold `bytes`; `data` is borrowed until the sync.
        unsafe { self.stream.dev().copy(self.stream.raw(), self.ptr, data.as_ptr() as u64, bytes)? };
        self.stream.synchronize()
    }

    /// Copies the contents out (same length), after the work queued on its stream.
    pub fn copy_to_host(&self, out: &mut [T]) -> Result<()> {
        self.check_len(out.len())?;
        let bytes = std::mem::size_of_val(out);
        // SAFETY: both ranges hold `bytes`; `out` is borrowed until the sync.
        unsafe { self.stream.dev().copy(self.stream.raw(), out.as_mut_ptr() as u64, self.ptr, bytes)? };
        self.stream.synchronize()
    }

    /// The contents as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    fn check_len(&self, n: usize) -> Result<()> {
        if n != self.len {
            return Err(Error::new(crate::ErrorKind::BufferSize { what: "host buffer", expected: self.len, got: n }));
        }
        Ok(())
    }

    /// `Ok` when the pointer is device memory of the stream's device and
    /// context (bad input from `from_raw` is an error, not a wild access).
    pub(crate) fn check_memory(&self, what: &str) -> Result<()> {
        let dev = &self.stream.dev();
        match dev.classify(self.ptr) {
            Memory::Device { context, .. } if context == dev.context() => Ok(()),
            Memory::Device { ordinal, .. } => Err(Error::device(format!(
                "{what} is memory of another context (GPU {ordinal}) than its stream's ({})",
                dev.describe()
            ))),
            Memory::Host => {
                Err(Error::device(format!("{what} is host memory, not device memory of {}", dev.describe())))
            }
        }
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.owned {
            let _ = self.stream.dev().sync(self.stream.raw());
            // SAFETY: allocated by `Gpu::alloc` on this device; dropped once.
            unsafe { self.stream.dev().free(self.ptr) };
        }
    }
}
