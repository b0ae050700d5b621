//! [`Device`] over the CUDA driver (cudarc, loaded at run time): ccl's
//! kernels compiled by NVRTC for the device's architecture on first use,
//! copies with `cuMemcpyAsync` (unified addressing: any direction), IPC
//! with `cuIpcGetMemHandle` / `cuIpcOpenMemHandle`.

use super::{Device, Kernels, Launch, Memory, Until};
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Threads per block of every kernel launch.
const THREADS: u64 = 256;
/// Blocks per SM at most (the kernels' grid-stride loops cover the rest):
/// enough resident warps to keep the memory system busy.
const BLOCKS_PER_SM: u64 = 4;

/// A driver handle that is used from any thread once the context is bound.
#[derive(Clone, Copy, Debug)]
struct Raw<P>(P);
// SAFETY: CUDA driver handles (modules, functions) may be used from any
// thread whose current context is theirs; every use below binds it first.
unsafe impl<P> Send for Raw<P> {}
// SAFETY: as above; the handles are immutable once created.
unsafe impl<P> Sync for Raw<P> {}

/// One GPU through the driver.
pub(crate) struct Cuda {
    ctx: Arc<CudaContext>,
    name: String,
    arch: &'static str,
    /// Loaded modules by source (one per element type: the primitive
    /// types share one), and their functions by name.
    modules: Mutex<HashMap<Arc<str>, Raw<sys::CUmodule>>>,
    functions: Mutex<HashMap<String, Raw<sys::CUfunction>>>,
    streams: Mutex<HashMap<u64, Arc<CudaStream>>>,
    /// A stream of ccl's own for reading and writing flags from the host
    /// (non-blocking: it waits for no other stream).
    own: Arc<CudaStream>,
    /// Streaming multiprocessors: grids are sized to them.
    sms: u64,
    /// Bytes of memory.
    memory: usize,
    /// Whether streams can wait on and write 64-bit words themselves
    /// (`CAN_USE_64_BIT_STREAM_MEM_OPS`); else one-thread kernels of
    /// [`SOURCE`](ccl_kernels::cuda::SOURCE) poll and store the flags.
    mem_ops: bool,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.describe())
    }
}

fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::device(format!("{what}: {r:?}")))
    }
}

fn no_driver() -> Result<()> {
    if ccl_kernels::cuda::driver_available() {
        Ok(())
    } else {
        Err(Error::device(
            "no CUDA driver: libcuda.so.1 is not installed or not on LD_LIBRARY_PATH (is there a GPU here?)",
        ))
    }
}

impl Cuda {
    /// GPUs on this host.
    pub fn count() -> Result<usize> {
        no_driver()?;
        let n = CudaContext::device_count().map_err(|e| Error::device(format!("counting GPUs: {e:?}")))?;
        if n <= 0 {
            return Err(Error::device("the CUDA driver sees no GPU"));
        }
        Ok(n as usize)
    }

    /// GPU `ordinal`'s primary context.
    pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
        no_driver()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::device(format!("cannot open GPU {ordinal}: {e:?}")))?;
        let (major, minor) =
            ctx.compute_capability().map_err(|e| Error::device(format!("GPU {ordinal} capability: {e:?}")))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        // one string per architecture for the life of the process (the
        // compiled-code cache is keyed by it)
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let (modules, functions, streams) = (Mutex::default(), Mutex::default(), Mutex::default());
        let own = ctx.new_stream().map_err(|e| Error::device(format!("GPU {ordinal}: new stream: {e:?}")))?;
        let ops = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS;
        let mem_ops = ctx.attribute(ops).unwrap_or(0) != 0 && std::env::var_os("CCL_GPU_FLAG_KERNELS").is_none();
        let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(1);
        let sms = sms.max(1) as u64;
        let mut memory = 0usize;
        // SAFETY: an out-pointer and the context's device (0 stays on failure).
        unsafe { sys::cuDeviceTotalMem_v2(&mut memory, ctx.cu_device()) };
        Ok(Arc::new(Cuda { ctx, name, arch, modules, functions, streams, own, sms, memory, mem_ops }))
    }

    /// The primitive types' kernel source (the flag kernels are there).
    fn primitive(&self) -> Arc<str> {
        static SOURCE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        Arc::clone(SOURCE.get_or_init(|| Arc::from(ccl_kernels::cuda::SOURCE)))
    }

    /// Launches `f` on `stream` with `(blocks, threads)` and u64 `args`.
    ///
    /// # Safety
    /// `args` are the kernel's parameters, each a u64, and every address
    /// among them is valid for what the kernel does until the stream has
    /// passed it.
    unsafe fn run(
        &self,
        stream: u64,
        f: sys::CUfunction,
        shape: (u32, u32),
        args: &mut [u64],
        name: &str,
    ) -> Result<()> {
        let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a as *mut u64 as *mut c_void).collect();
        // SAFETY: per the contract.
        let r = unsafe {
            sys::cuLaunchKernel(
                f,
                shape.0,
                1,
                1,
                shape.1,
                1,
                1,
                0,
                stream as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(r, name)
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| Error::device(format!("binding {}: {e:?}", self.describe())))
    }

    /// The kernel `name` of `k`'s source, compiled and loaded on first use.
    fn function(&self, source: &Arc<str>, name: &str) -> Result<sys::CUfunction> {
        let mut f = self.functions.lock().map_err(|_| Error::internal("kernel table poisoned"))?;
        if let Some(h) = f.get(name) {
            return Ok(h.0);
        }
        let module = self.module(source)?;
        let c = std::ffi::CString::new(name).map_err(|_| Error::internal("kernel name with a NUL byte"))?;
        let mut h: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check(unsafe { sys::cuModuleGetFunction(&mut h, module, c.as_ptr()) }, name)?;
        f.insert(name.to_string(), Raw(h));
        Ok(h)
    }

    /// The module of `source`, compiled by NVRTC for this GPU and loaded once.
    fn module(&self, source: &Arc<str>) -> Result<sys::CUmodule> {
        let mut m = self.modules.lock().map_err(|_| Error::internal("module table poisoned"))?;
        if let Some(h) = m.get(source) {
            return Ok(h.0);
        }
        let image = ccl_kernels::cuda::image(source, self.arch).map_err(Error::device)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a CUBIN image or NUL-terminated PTX, alive for the call;
        // the module is kept for the life of the process (its functions
        // are cached).
        let r = unsafe { sys::cuModuleLoadData(&mut module, image.bytes().as_ptr() as *const c_void) };
        check(r, "loading kernels")?;
        m.insert(Arc::clone(source), Raw(module));
        Ok(module)
    }
}

impl Device for Cuda {
    fn describe(&self) -> String {
        format!("GPU {} ({}, {})", self.ctx.ordinal(), self.name, self.arch)
    }
    fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }
    fn context(&self) -> u64 {
        self.ctx.cu_ctx() as u64
    }
    fn memory(&self) -> usize {
        self.memory
    }
    fn classify(&self, ptr: u64) -> Memory {
        if self.bind().is_err() {
            return Memory::Host;
        }
        let mut kind: u32 = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut ordinal: i32 = 0;
        let attr = |what: sys::CUpointer_attribute, out: *mut c_void| {
            // SAFETY: `out` points to a value of the attribute's type.
            unsafe { sys::cuPointerGetAttribute(out, what, ptr) == sys::CUresult::CUDA_SUCCESS }
        };
        let device = attr(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, &mut kind as *mut u32 as _)
            && kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        if device
            && attr(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT, &mut ctx as *mut sys::CUcontext as _)
            && attr(sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, &mut ordinal as *mut i32 as _)
        {
            // stream-ordered (pool) allocations may name no context: their device's primary one
            let same = ctx.is_null() && ordinal as usize == self.ordinal();
            Memory::Device { ordinal: ordinal as usize, context: if same { self.context() } else { ctx as u64 } }
        } else {
            Memory::Host
        }
    }
    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: an out-pointer and a size.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) }, "cuMemAlloc")?;
        Ok(p)
    }
    unsafe fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            // SAFETY: per the contract, from `alloc` and not used again.
            unsafe { sys::cuMemFree_v2(ptr) };
        }
    }
    unsafe fn copy(&self, stream: u64, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: per the contract, both ranges valid until the stream passes the copy.
        check(unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream as sys::CUstream) }, "cuMemcpyAsync")
    }
    unsafe fn launch(&self, stream: u64, k: &Kernels, l: Launch) -> Result<()> {
        self.bind()?;
        let name = k.name_of(&l)?;
        let (mut args, n): (Vec<u64>, usize) = match l {
            Launch::Reduce { dst, a, b, n } => (vec![dst, a, b, n as u64], n),
            Launch::RecvReduceSend { out, next, slot, local, n } => (vec![out, next, slot, local, n as u64], n),
            Launch::Div { buf, ranks, n } => (vec![buf, ranks as u64, n as u64], n),
        };
        let f = self.function(&k.source, name)?;
        // a thread per 16 bytes (the kernels' vector width), up to a few blocks per SM
        let vectors = (n * k.elem).div_ceil(16) as u64;
        let blocks = vectors.div_ceil(THREADS).clamp(1, self.sms * BLOCKS_PER_SM) as u32;
        // SAFETY: the kernel's parameters are these u64s, valid per the contract.
        unsafe { self.run(stream, f, (blocks, THREADS as u32), &mut args, name) }
    }
    unsafe fn write_value(&self, stream: u64, addr: u64, value: u64) -> Result<()> {
        self.bind()?;
        if !self.mem_ops {
            let f = self.function(&self.primitive(), "ccl_set_flag")?;
            // SAFETY: (flag address, value), as the kernel declares; valid per the contract.
            return unsafe { self.run(stream, f, (1, 1), &mut [addr, value], "ccl_set_flag") };
        }
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: per the contract, `addr` is a valid aligned word until the stream passes it.
        let r = unsafe { sys::cuStreamWriteValue64_v2(stream as sys::CUstream, addr, value, flags) };
        check(r, "cuStreamWriteValue64")
    }
    unsafe fn wait_value(&self, stream: u64, addr: u64, until: Until) -> Result<()> {
        self.bind()?;
        use sys::CUstreamWaitValue_flags as W;
        if !self.mem_ops {
            let (value, how) = match until {
                Until::AtLeast(v) => (v, 0),
                Until::SomeSet(m) => (m, 1),
                Until::SomeClear(m) => (m, 2),
            };
            let f = self.function(&self.primitive(), "ccl_wait_flag")?;
            // SAFETY: (flag address, value, how), as the kernel declares; valid per the contract.
            return unsafe { self.run(stream, f, (1, 1), &mut [addr, value, how], "ccl_wait_flag") };
        }
        let (value, flags) = match until {
            Until::AtLeast(v) => (v, W::CU_STREAM_WAIT_VALUE_GEQ as u32),
            Until::SomeSet(m) => (m, W::CU_STREAM_WAIT_VALUE_AND as u32),
            Until::SomeClear(m) => (!m, W::CU_STREAM_WAIT_VALUE_NOR as u32),
        };
        // SAFETY: as in `write_value`.
        let r = unsafe { sys::cuStreamWaitValue64_v2(stream as sys::CUstream, addr, value, flags) };
        check(r, "cuStreamWaitValue64")
    }
    fn join(&self, later: u64, earlier: u64) -> Result<()> {
        self.bind()?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: an out-pointer; the event is destroyed below, which the
        // driver defers until the wait on it has been satisfied.
        check(unsafe { sys::cuEventCreate(&mut ev, flags) }, "cuEventCreate")?;
        // SAFETY: a fresh event and two streams of this context (checked by callers).
        let r = unsafe {
            check(sys::cuEventRecord(ev, earlier as sys::CUstream), "cuEventRecord")
                .and_then(|()| check(sys::cuStreamWaitEvent(later as sys::CUstream, ev, 0), "cuStreamWaitEvent"))
        };
        // SAFETY: created above, destroyed once.
        unsafe { sys::cuEventDestroy_v2(ev) };
        r
    }
    fn idle(&self, stream: u64) -> Result<bool> {
        self.bind()?;
        // SAFETY: a stream handle of this context (checked by callers) or 0.
        match unsafe { sys::cuStreamQuery(stream as sys::CUstream) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuStreamQuery").map(|()| true),
        }
    }
    fn read_word(&self, addr: u64) -> Result<u64> {
        self.bind()?;
        let mut v = 0u64;
        let own = self.own.cu_stream();
        // SAFETY: an aligned device word (per the callers) into a local,
        // which lives until the synchronisation of ccl's own stream.
        unsafe {
            check(sys::cuMemcpyDtoHAsync_v2(&mut v as *mut u64 as *mut c_void, addr, 8, own), "reading a flag")?;
            check(sys::cuStreamSynchronize(own), "reading a flag")?;
        }
        Ok(v)
    }
    unsafe fn write_word(&self, addr: u64, value: u64) -> Result<()> {
        self.bind()?;
        let own = self.own.cu_stream();
        // SAFETY: per the contract; the local lives until the synchronisation.
        unsafe {
            check(sys::cuMemcpyHtoDAsync_v2(addr, &value as *const u64 as *const c_void, 8, own), "writing a flag")?;
            check(sys::cuStreamSynchronize(own), "writing a flag")
        }
    }
    fn reach(&self, owner: &dyn Device) -> Result<()> {
        if owner.context() == self.context() {
            return Ok(());
        }
        self.bind()?;
        let (mut me, mut them, mut can) = (0, 0, 0);
        // SAFETY: out-pointers; ordinals of devices the driver opened.
        unsafe {
            check(sys::cuDeviceGet(&mut me, self.ordinal() as i32), "cuDeviceGet")?;
            check(sys::cuDeviceGet(&mut them, owner.ordinal() as i32), "cuDeviceGet")?;
            check(sys::cuDeviceCanAccessPeer(&mut can, me, them), "cuDeviceCanAccessPeer")?;
        }
        if can == 0 {
            return Err(super::no_peer_access(self, owner));
        }
        // SAFETY: the other device's primary context, alive while its device is open.
        match unsafe { sys::cuCtxEnablePeerAccess(owner.context() as sys::CUcontext, 0) } {
            sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            r => check(r, "cuCtxEnablePeerAccess"),
        }
    }
    fn sync(&self, stream: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: a stream handle of this context (checked by callers) or 0.
        check(unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) }, "cuStreamSynchronize")
    }
    fn begin_capture(&self, stream: u64) -> Result<()> {
        self.bind()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a stream of this context (checked by callers).
        check(unsafe { sys::cuStreamBeginCapture_v2(stream as sys::CUstream, mode) }, "cuStreamBeginCapture")
    }
    fn end_capture(&self, stream: u64) -> Result<u64> {
        self.bind()?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: out-pointers; the graph is destroyed once instantiated
        // (the executable graph keeps what it needs).
        unsafe {
            check(sys::cuStreamEndCapture(stream as sys::CUstream, &mut graph), "cuStreamEndCapture")?;
            let r = check(sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0), "cuGraphInstantiate");
            sys::cuGraphDestroy(graph);
            r?;
        }
        Ok(exec as u64)
    }
    fn capturing(&self, stream: u64) -> Result<bool> {
        self.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a stream of this context and an out-pointer.
        check(unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) }, "cuStreamIsCapturing")?;
        Ok(status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
    }
    fn launch_graph(&self, graph: u64, stream: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: an executable graph from `end_capture`, alive until `drop_graph`.
        check(unsafe { sys::cuGraphLaunch(graph as sys::CUgraphExec, stream as sys::CUstream) }, "cuGraphLaunch")
    }
    fn drop_graph(&self, graph: u64) {
        if self.bind().is_ok() {
            // SAFETY: from `end_capture`, destroyed once.
            unsafe { sys::cuGraphExecDestroy(graph as sys::CUgraphExec) };
        }
    }
    fn new_stream(&self) -> Result<u64> {
        let s = self.ctx.new_stream().map_err(|e| Error::device(format!("new stream: {e:?}")))?;
        let raw = s.cu_stream() as u64;
        self.streams.lock().map_err(|_| Error::internal("stream table poisoned"))?.insert(raw, s);
        Ok(raw)
    }
    fn stream_context(&self, stream: u64) -> Result<u64> {
        if stream == 0 {
            return Ok(self.context());
        }
        self.bind()?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: an out-pointer; a stale handle makes the driver return an error.
        check(unsafe { sys::cuStreamGetCtx(stream as sys::CUstream, &mut ctx) }, "the stream's context")?;
        Ok(ctx as u64)
    }
    fn drop_stream(&self, stream: u64) {
        if let Ok(mut s) = self.streams.lock() {
            s.remove(&stream);
        }
    }
    unsafe fn pin(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: per the contract, the range stays allocated until unpinned.
        check(unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, bytes, flags) }, "cuMemHostRegister")
    }
    unsafe fn unpin(&self, ptr: *mut u8) {
        if self.bind().is_ok() {
            // SAFETY: per the contract, pinned by `pin` and still allocated.
            unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
        }
    }
    fn export(&self, ptr: u64) -> Result<[u8; 64]> {
        self.bind()?;
        // SAFETY: a zeroed handle is a valid out-value.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is the base of an allocation of this context.
        check(unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) }, "cuIpcGetMemHandle")?;
        let mut out = [0u8; 64];
        for (o, c) in out.iter_mut().zip(h.reserved.iter()) {
            *o = *c as u8;
        }
        Ok(out)
    }
    fn import(&self, handle: &[u8; 64]) -> Result<u64> {
        self.bind()?;
        // SAFETY: a zeroed handle is a valid value; filled below.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (c, b) in h.reserved.iter_mut().zip(handle) {
            *c = *b as _;
        }
        let mut p: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a handle from another process's cuIpcGetMemHandle.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) }, "cuIpcOpenMemHandle")?;
        Ok(p)
    }
    unsafe fn unimport(&self, ptr: u64) {
        if self.bind().is_ok() {
            // SAFETY: per the contract, from `import` and not used again.
            unsafe { sys::cuIpcCloseMemHandle(ptr) };
        }
    }
}
