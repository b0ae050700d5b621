//! `--backend gloo`: the same all-reduce sweep through Gloo (Facebook's
//! collective library, the CPU backend of PyTorch's `torch.distributed`),
//! linked from Debian's `libgloo-dev` through the C interface in
//! `gloo.cc`. Ranks are started by `cclrun` (rank and size come from its
//! environment) and meet through Gloo's file store in a directory under
//! the temporary directory, so all ranks must be on one host; they talk
//! over loopback TCP, Gloo's transport. Float sum only. `--algo` picks
//! Gloo's algorithm: ring_chunked (the default), halving_doubling, ring,
//! bcube. Gloo's algorithms reduce in place, so both column groups are
//! in-place measurements (the first one first).

use super::table::{self, Mode};
use super::{Args, Coll};
use std::ffi::{c_char, c_int, CStr, CString};
use std::time::Instant;

#[repr(C)]
struct Ctx {
    _opaque: [u8; 0],
}

#[repr(C)]
struct Algo {
    _opaque: [u8; 0],
}

extern "C" {
    fn ccl_gloo_connect(
        rank: c_int,
        size: c_int,
        store: *const c_char,
        host: *const c_char,
        timeout_ms: c_int,
        err: *mut c_char,
        len: usize,
    ) -> *mut Ctx;
    fn ccl_gloo_close(c: *mut Ctx);
    fn ccl_gloo_all_reduce_new(
        c: *mut Ctx,
        buf: *mut f32,
        count: c_int,
        which: c_int,
        err: *mut c_char,
        len: usize,
    ) -> *mut Algo;
    fn ccl_gloo_run(a: *mut Algo, err: *mut c_char, len: usize) -> c_int;
    fn ccl_gloo_all_reduce_free(a: *mut Algo);
    fn ccl_gloo_fold(c: *mut Ctx, v: *mut f64, max: c_int, err: *mut c_char, len: usize) -> c_int;
    fn ccl_gloo_barrier(c: *mut Ctx, err: *mut c_char, len: usize) -> c_int;
}

/// Gloo's algorithms by `--algo` name, in the C interface's numbering.
const ALGOS: [&str; 4] = ["ring_chunked", "halving_doubling", "ring", "bcube"];

/// How long Gloo waits for a peer before it fails the call.
const TIMEOUT_MS: c_int = 120_000;

/// A room for the message of a failed Gloo call.
struct Msg([c_char; Msg::LEN]);

impl Msg {
    const LEN: usize = 512;

    /// Runs `f` (a C call returning 0 on success) with a message room; on
    /// failure "what: Gloo's message".
    fn check(what: &str, f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), String> {
        let mut m = Msg([0; Msg::LEN]);
        match f(m.0.as_mut_ptr(), Msg::LEN) {
            0 => Ok(()),
            _ => Err(m.say(what)),
        }
    }

    /// Runs `f` (a C call returning null on failure) with a message room;
    /// what it made, or "what: Gloo's message".
    fn made<P>(what: &str, f: impl FnOnce(*mut c_char, usize) -> *mut P) -> Result<*mut P, String> {
        let mut m = Msg([0; Msg::LEN]);
        let p = f(m.0.as_mut_ptr(), Msg::LEN);
        if p.is_null() {
            Err(m.say(what))
        } else {
            Ok(p)
        }
    }

    fn say(&self, what: &str) -> String {
        // SAFETY: the buffer is zeroed at creation and the C side writes at
        // most LEN - 1 bytes and a NUL, so it always holds a C string
        let msg = unsafe { CStr::from_ptr(self.0.as_ptr()) };
        format!("{what}: {}", msg.to_string_lossy())
    }
}

/// A connected Gloo context, closed on drop.
struct Context(*mut Ctx);

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: made by ccl_gloo_connect, closed once, here
        unsafe { ccl_gloo_close(self.0) }
    }
}

impl Context {
    fn barrier(&self) -> Result<(), String> {
        // SAFETY: a live context; the message room is as long as said
        Msg::check("gloo barrier", |e, len| unsafe { ccl_gloo_barrier(self.0, e, len) })
    }

    /// Every rank's `v` folded by max (`max`) or sum.
    fn fold(&self, v: f64, max: bool) -> Result<f64, String> {
        let mut x = v;
        // SAFETY: a live context; `x` is one f64 for the call's duration
        Msg::check("gloo fold", |e, len| unsafe { ccl_gloo_fold(self.0, &mut x, c_int::from(max), e, len) })?;
        Ok(x)
    }
}

/// One size's all-reduce, set up once (Gloo registers the buffer) and run
/// as often as timed.
struct AllReduce<'a> {
    algo: *mut Algo,
    buf: &'a mut [f32],
}

impl<'a> AllReduce<'a> {
    fn new(c: &Context, buf: &'a mut [f32], which: usize) -> Result<Self, String> {
        let count = c_int::try_from(buf.len()).map_err(|_| format!("gloo counts are ints: {} floats", buf.len()))?;
        let ptr = buf.as_mut_ptr();
        // SAFETY: a live context; `buf` stays borrowed (and so in place)
        // for as long as the algorithm that holds its address lives
        let algo = Msg::made("gloo all_reduce setup", |e, len| unsafe {
            ccl_gloo_all_reduce_new(c.0, ptr, count, which as c_int, e, len)
        })?;
        Ok(AllReduce { algo, buf })
    }

    fn run(&self) -> Result<(), String> {
        // SAFETY: a live algorithm whose buffer is still borrowed
        Msg::check("gloo all_reduce", |e, len| unsafe { ccl_gloo_run(self.algo, e, len) })
    }

    /// The buffer as the last run left it.
    fn data(&self) -> &[f32] {
        self.buf
    }
}

impl Drop for AllReduce<'_> {
    fn drop(&mut self) {
        // SAFETY: made by ccl_gloo_all_reduce_new, freed once, here
        unsafe { ccl_gloo_all_reduce_free(self.algo) }
    }
}

/// Rank `r`'s value at position `i`, as the ccl backend's.
fn value(r: usize, i: usize) -> f32 {
    super::value(r, i, false)
}

/// Runs the sweep; the process exit code.
pub fn run(a: &Args, coll: Coll) -> i32 {
    let setup = || -> Result<(usize, usize, usize, String), String> {
        if coll != Coll::AllReduce || a.dtype != "float" || a.op != "sum" {
            return Err("--backend gloo measures all_reduce float sum only".into());
        }
        let name = a.algo.as_deref().unwrap_or(ALGOS[0]);
        let which = ALGOS
            .iter()
            .position(|x| *x == name)
            .ok_or_else(|| format!("--backend gloo measures {}, not {name:?}", ALGOS.join(", ")))?;
        let unset = |v: &str| format!("--backend gloo runs under cclrun: {v} is not set");
        let num = |v: &str| std::env::var(v).ok().and_then(|x| x.parse().ok()).ok_or_else(|| unset(v));
        let id = std::env::var("CCL_UNIQUE_ID").map_err(|_| unset("CCL_UNIQUE_ID"))?;
        Ok((which, num("CCL_RANK")?, num("CCL_WORLD_SIZE")?, id))
    };
    let (which, r, n, id) = match setup() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ccl-perf: {e}");
            return 2;
        }
    };
    match sweep(a, which, r, n, &id) {
        Ok(wrong) => i32::from(wrong > 0),
        Err(e) => {
            eprintln!("ccl-perf: rank {r} of {n}, gloo all_reduce: {e}");
            1
        }
    }
}

/// The sweep of Gloo's algorithm `which` as rank `r` of `n` of cclrun job
/// `id`; elements wrong in all.
fn sweep(a: &Args, which: usize, r: usize, n: usize, id: &str) -> Result<u64, String> {
    let name = ALGOS[which];
    let dir = std::env::temp_dir().join(format!("ccl-perf-gloo-{}", id.replace(['/', ':'], "_")));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let store = CString::new(dir.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    let host = CString::new("127.0.0.1").map_err(|e| e.to_string())?;
    // SAFETY: both strings are NUL-terminated and outlive the call; the
    // message room is as long as said
    let ctx = Msg::made(&format!("gloo connect (store {})", dir.display()), |e, len| unsafe {
        ccl_gloo_connect(r as c_int, n as c_int, store.as_ptr(), host.as_ptr(), TIMEOUT_MS, e, len)
    })?;
    let ctx = Context(ctx);
    if r == 0 {
        println!(
            "# ccl-perf: all_reduce on {n} ranks, float sum, {} .. {} bytes ×{}, {} iters, {} warmup, backend gloo ({name}, loopback TCP; in place)",
            a.min, a.max, a.factor, a.iters, a.warmup
        );
    }
    let mut size = a.min.max(4);
    let mut table = table::Table::new(r == 0, Coll::AllReduce.name(), n, false);
    while size <= a.max.max(4) {
        let count = size / 4;
        let bytes = count * 4;
        let mut buf = vec![0f32; count];
        let mut modes = Vec::new();
        for _ in 0..2 {
            buf.iter_mut().enumerate().for_each(|(i, x)| *x = value(r, i));
            let call = AllReduce::new(&ctx, &mut buf, which)?;
            call.run()?;
            let want = |q: usize| (0..n).map(|s| value(s, q)).sum::<f32>();
            let wrong = call.data().iter().enumerate().filter(|(q, x)| want(*q) != **x).count();
            for _ in 0..a.warmup {
                call.run()?;
            }
            ctx.barrier()?;
            let t = Instant::now();
            for _ in 0..a.iters.max(1) {
                call.run()?;
            }
            let secs = ctx.fold(t.elapsed().as_secs_f64() / a.iters.max(1) as f64, true)?;
            let wrong = ctx.fold(wrong as f64, false)? as u64;
            let algbw = bytes as f64 / secs / 1e9;
            modes.push(Mode {
                time_us: secs * 1e6,
                algbw,
                busbw: algbw * Coll::AllReduce.busbw_factor(n),
                wrong,
                host_us: None,
            });
        }
        table.row(bytes, count, "float", "sum", -1, &modes[0], &modes[1]);
        if a.factor < 2 {
            break;
        }
        size = size.saturating_mul(a.factor);
    }
    ctx.barrier()?;
    table.footer();
    let title = format!("ccl-perf --backend gloo: all_reduce on {n} ranks ({name})");
    let saved = table.save(a.plot.as_deref(), a.json.as_deref(), &title, "Gloo");
    if r == 0 {
        // every rank has connected (the barrier above): the store is done
        let _ = std::fs::remove_dir_all(&dir);
    }
    // A rank leaving closes its sockets, which fails a peer's Gloo call
    // still waiting on them, even one whose messages all arrived. No rank
    // leaves this second barrier before every rank has finished the first,
    // so every call that mattered has ended: what this one says is moot.
    let _ = ctx.barrier();
    saved.map_err(|_| "--plot or --json: cannot write the file".to_string())?;
    Ok(table.wrong())
}
