//! The executor's steps on device buffers: opening a connection's device
//! slots (the hello, see [`device`](super::device)), the one message per
//! call and connection that checks the calls match, and queueing each
//! slot of a step as copies, kernels and flag operations on the call's
//! stream. Nothing here waits for the GPU: a staged (tcp) connection,
//! whose bytes must pass through the host, holds its host slots until the
//! stream has copied them, and the proxy thread (see
//! [`Proxy`](super::conns::Proxy)) drives such calls after they return.

use super::{device, Conns, Exec};
use crate::transport::{RecvVerbs, SendVerbs};
use crate::algo::{Region, Step};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::plan::fingerprint;
use crate::Reduce;

/// A channel's slot whose copies through host slots are queued: the
/// staged connections it posts on and releases once they have run, the
/// bytes it sends, and where the channel goes next.
#[derive(Clone, Copy, Debug)]
pub(super) struct Staged {
    si: Option<usize>,
    ri: Option<usize>,
    bytes: usize,
    next: (usize, usize),
}

/// A device step's slots: the host slots claimed (staged connections) and
/// the connections.
pub(super) struct Io {
    /// The channel's stream.
    pub stream: u64,
    pub host_in: Option<*const u8>,
    pub host_out: Option<*mut u8>,
    pub si: Option<usize>,
    pub ri: Option<usize>,
}

impl<T: Reduce, O: ReduceOp<T>> Exec<T, O> {
    /// Opens the device slots of the step's connections (a hello each way
    /// they go); `false` while a hello cannot be sent or has not arrived.
    pub(super) fn gpu_open(
        &mut self,
        si: Option<usize>,
        ri: Option<usize>,
        st: &Step,
        conns: &mut Conns,
    ) -> Result<bool> {
        let Some(g) = &self.gpu else { return Ok(true) };
        let dev = std::sync::Arc::clone(&g.call.dev);
        if let Some(si) = si.filter(|&si| conns.dev_send(si).is_none()) {
            let peer = st.send_peer().unwrap_or(0);
            let slot_bytes = conns.slot_bytes();
            let Some(p) = conns.send_at(si).reserve(slot_bytes, false).map_err(|e| e.with_peer(peer))? else {
                return Ok(false);
            };
            // SAFETY: a reserved slot holds at least `slot_bytes` (checked
            // when connecting) and is ours until posted.
            let host = unsafe { std::slice::from_raw_parts_mut(p, slot_bytes) };
            // handed over on the GPUs, the device slots calls are cut by; staged, a host slot
            let staged = conns.send_at(si).offers().staged;
            let (nslots, bytes) = if staged { (1, slot_bytes) } else { (g.call.slots.nslots, g.call.slots.slot_bytes) };
            let (mut ds, bytes) =
                device::DevSend::open(&dev, staged, nslots, bytes, host).map_err(|e| e.with_peer(peer))?;
            // SAFETY: the staging memory lives as long as the connection,
            // which `Conns` drops after the device slots (and this guard).
            ds.pinned = unsafe { device::Pinned::new(&dev, conns.send_at(si).staging_memory()) };
            if !ds.staged {
                // a receiver in this process reads these slots in place: they
                // live until it is done with the connection too
                conns.send_at(si).attach(std::sync::Arc::clone(&ds.mem) as crate::transport::fifo::Attachment);
            }
            conns.send_at(si).post(bytes, &device::HELLO);
            *conns.dev_send(si) = Some(ds);
        }
        if let Some(ri) = ri.filter(|&ri| conns.dev_recv(ri).is_none()) {
            let peer = st.recv_peer().unwrap_or(0);
            let Some((p, bytes, fp)) = conns.recv_at(ri).peek().map_err(|e| e.with_peer(peer))? else {
                return Ok(false);
            };
            // SAFETY: a peeked slot of `bytes` bytes, ours until released.
            let hello = unsafe { std::slice::from_raw_parts(p, bytes) };
            let ours = format!("{} on device memory", fingerprint::Fingerprint::describe(&self.fp));
            let attached = conns.recv_at(ri).attached();
            // (a sender gone since its hello leaves nothing to map: say so)
            let slots = g.call.slots;
            let mut dr = device::DevRecv::accept(&dev, hello, fp, (ours, slots), attached)
                .map_err(|e| conns.check_alive(&[peer]).err().unwrap_or(e).with_peer(peer))?;
            // SAFETY: as for the sending side above.
            dr.pinned = unsafe { device::Pinned::new(&dev, conns.recv_at(ri).staging_memory()) };
            conns.recv_at(ri).release();
            *conns.dev_recv(ri) = Some(dr);
        }
        Ok(true)
    }

    /// Sends and checks this call's message on each of the step's
    /// connections that hand off on the device, once per call (staged
    /// ones check every message); `false` while a slot is full or the
    /// peer's message has not come.
    fn gpu_greet(&mut self, st: &Step, (si, ri): (Option<usize>, Option<usize>), conns: &mut Conns) -> Result<bool> {
        let Some(g) = &self.gpu else { return Ok(true) };
        let flagged_send = si.filter(|&si| !g.told.contains(&si) && conns.dev_send(si).as_ref().is_some_and(|d| !d.staged));
        let flagged_recv =
            ri.filter(|&ri| !g.heard.contains(&ri) && conns.dev_recv(ri).as_ref().is_some_and(|d| d.flag().is_some()));
        if let Some(ri) = flagged_recv {
            let peer = st.recv_peer().unwrap_or(0);
            let Some((_, bytes, fp)) = conns.recv_at(ri).peek().map_err(|e| e.with_peer(peer))? else {
                return Ok(false);
            };
            self.check_message(peer, (bytes, fp), 0, conns)?;
            conns.recv_at(ri).release();
            if let Some(g) = self.gpu.as_mut() {
                g.heard.push(ri);
            }
        }
        if let Some(si) = flagged_send {
            let peer = st.send_peer().unwrap_or(0);
            if conns.send_at(si).reserve(0, false).map_err(|e| e.with_peer(peer))?.is_none() {
                return Ok(false);
            }
            conns.send_at(si).post(0, &self.fp);
            if let Some(g) = self.gpu.as_mut() {
                g.told.push(si);
            }
        }
        Ok(true)
    }

    /// Takes a proxied call's channel streams when its turn comes (see
    /// [`Proxy`](super::conns::Proxy)); `false` until then.
    pub(super) fn gpu_started(&mut self, conns: &mut Conns) -> Result<bool> {
        let n = self.pcs.len();
        let Some(g) = self.gpu.as_mut().filter(|g| g.streams.is_empty()) else { return Ok(true) };
        let Some(t) = g.ticket else { return Ok(true) };
        match conns.dev_channels(&g.call, n, t)? {
            Some(streams) => g.streams = streams,
            None => return Ok(false),
        }
        Ok(true)
    }

    /// Whether a channel waits for its stream to copy through a host slot.
    pub(super) fn gpu_pending(&self) -> bool {
        self.gpu.as_ref().is_some_and(|g| g.stage.iter().any(Option::is_some))
    }

    /// Ends the call's device work once every channel is queued: the
    /// channels' streams join the one the call ends on (its caller's, or
    /// a proxied call's first channel's, which then says the call is
    /// done), after which Avg's division runs; then hands the call to the
    /// GPU watch ([`crate::gpu::watch`]) if its streams wait on peers.
    pub(super) fn gpu_join(&mut self, conns: &mut Conns) -> Result<()> {
        let what = format!("{} at rank {}", fingerprint::Fingerprint::describe(&self.fp), conns.me());
        let out = self.layout.resolve(Region::new(crate::algo::Buf::Output, 0, self.layout.output));
        let buf = self.dptr(out);
        let Some(g) = self.gpu.as_mut() else { return Ok(()) };
        let (dev, k) = (&g.call.dev, &g.call.kernels);
        let end = if g.ticket.is_some() { g.streams.first().copied().unwrap_or(0) } else { g.call.stream.raw() };
        for &s in g.streams.iter().filter(|&&s| s != end) {
            dev.join(end, s)?;
        }
        if let Some(ranks) = g.call.finish.filter(|_| k.div.is_some() && out.len > 0) {
            // SAFETY: a validated region of the output buffer, which the
            // caller keeps until the stream has passed the call.
            unsafe { dev.launch(end, k, crate::gpu::Launch::Div { buf, ranks, n: out.len })? };
        }
        if let Some(t) = g.ticket {
            // SAFETY: the communicator's proxy word, kept while calls use it.
            unsafe { dev.write_value(end, t.done, t.n)? };
            conns.proxy.queued = t.n;
        }
        g.joined = true;
        if !g.waits.is_empty() && !g.captured {
            crate::gpu::watch::watch(crate::gpu::watch::InFlight {
                stream: g.call.stream.clone(),
                flags: g.releases(),
                marks: std::mem::take(&mut g.marks),
                alive: conns.liveness(g.peers.to_vec()),
                deadline: std::time::Instant::now() + g.call.timeout,
                what,
                abandoned: None,
                released: false,
            });
        }
        Ok(())
    }

    /// Ends channel `c`'s slot whose copies through host slots were
    /// queued, once its stream has run them: the outgoing host slot is
    /// posted, the incoming one released. `None` when none is queued.
    fn gpu_unstage(&mut self, c: usize, conns: &mut Conns) -> Result<Option<bool>> {
        let Some(g) = self.gpu.as_mut() else { return Ok(None) };
        let Some(p) = g.stage.get(c).copied().flatten() else { return Ok(None) };
        if !g.call.dev.idle(g.streams.get(c).copied().unwrap_or(0))? {
            return Ok(Some(false));
        }
        g.stage[c] = None;
        if let Some(si) = p.si {
            conns.send_at(si).post(p.bytes, &self.fp);
        }
        if let Some(ri) = p.ri {
            conns.recv_at(ri).release();
        }
        self.pcs[c] = p.next;
        Ok(Some(true))
    }

    /// Queues one slot (or one local step) of channel `c`, at step `st`
    /// over connections `links`, on the call's stream.
    pub(super) fn gpu_slot(
        &mut self,
        c: usize,
        st: Step,
        (si, ri): (Option<usize>, Option<usize>),
        conns: &mut Conns,
    ) -> Result<bool> {
        if let Some(moved) = self.gpu_unstage(c, conns)? {
            return Ok(moved);
        }
        if !self.gpu_open(si, ri, &st, conns)? || !self.gpu_greet(&st, (si, ri), conns)? {
            return Ok(false);
        }
        let (i, u) = self.pcs[c];
        let (size, se, len) = (std::mem::size_of::<T>(), self.slot_elems, st.len());
        let n = len.saturating_sub(u * se).min(se);
        // staged connections carry the bytes in their host slots: claim them first
        let staged_in = ri.filter(|&ri| conns.dev_recv(ri).as_ref().is_some_and(|d| d.flag().is_none()));
        let staged_out = si.filter(|&si| conns.dev_send(si).as_ref().is_some_and(|d| d.staged));
        let staged = staged_in.or(staged_out).is_some();
        if staged && n * size > conns.slot_bytes() {
            return Err(Error::transport(format!(
                "a device message of {} B over a socket whose slots hold {} B: a job on one host whose ranks \
                 reach each other by tcp needs CCL_GPU_SLOT at most CCL_BUFFSIZE's slots (or CCL_SHM_DISABLE=1)",
                n * size,
                conns.slot_bytes()
            ))
            .with_peer(st.recv_peer().or(st.send_peer()).unwrap_or(0)));
        }
        let host_in = match staged_in {
            Some(ri) => {
                let peer = st.recv_peer().unwrap_or(0);
                let Some((p, bytes, fp)) = conns.recv_at(ri).peek().map_err(|e| e.with_peer(peer))? else {
                    return Ok(false);
                };
                self.check_message(peer, (bytes, fp), n * size, conns)?;
                Some(p)
            }
            None => None,
        };
        let host_out = match staged_out {
            Some(si) => {
                let peer = st.send_peer().unwrap_or(0);
                match conns.send_at(si).reserve(n * size, false).map_err(|e| e.with_peer(peer))? {
                    Some(p) => Some(p),
                    None => return Ok(false),
                }
            }
            None => None,
        };
        // a local step covers its whole region at once, a slot step one slot of it
        let at = |g: Region| self.layout.resolve(Region::new(g.buf, g.off + u * se, n));
        let (src, dst, elems) = match st {
            Step::Copy { src, dst } | Step::Reduce { src, dst } => {
                let d = self.layout.resolve(dst);
                (Some(self.layout.resolve(src)), Some(d), d.len)
            }
            _ => (st.reads().first().copied().map(at), st.writes().map(at), n),
        };
        let stream = self.gpu.as_ref().and_then(|g| g.streams.get(c).copied()).unwrap_or(0);
        self.gpu_step(st, src, dst, elems, Io { stream, host_in, host_out, si, ri }, conns)?;
        let slots = len.div_ceil(se).max(1);
        let next = if st.is_local() || u + 1 >= slots { (i + 1, 0) } else { (i, u + 1) };
        match self.gpu.as_mut() {
            // the host slots stay claimed until the stream has copied them
            Some(g) if staged => g.stage[c] = Some(Staged { si: staged_out, ri: staged_in, bytes: n * size, next }),
            _ => self.pcs[c] = next,
        }
        Ok(true)
    }

    /// One slot of a device step, queued on the call's stream: the waits
    /// for the incoming message and for a free outgoing slot, the copy or
    /// kernel, and the flags that say both are done. A staged side copies
    /// through its host slot, which goes back to the transport once the
    /// stream has run the copy ([`gpu_unstage`](Self::gpu_unstage)).
    fn gpu_step(
        &mut self,
        st: Step,
        src: Option<Region>,
        dst: Option<Region>,
        n: usize,
        io: Io,
        conns: &mut Conns,
    ) -> Result<()> {
        use crate::gpu::Launch;
        let bytes = n * std::mem::size_of::<T>();
        let missing = || Error::internal("device step on a connection without device slots");
        let (mut slot_in, mut flag_in, mut mark_in, mut stage_in) = (0, None, None, None);
        if let Some(ri) = io.ri {
            let r = conns.dev_recv(ri).as_ref().ok_or_else(missing)?;
            (slot_in, flag_in, mark_in) = (r.slot(), r.flag(), r.mark());
            if let (device::Source::Staged(m), Some(h)) = (&r.source, io.host_in) {
                stage_in = Some((m.ptr, h as u64));
            }
        }
        let (mut slot_out, mut flag_out, mut mark_out) = (0, None, None);
        if let Some(si) = io.si {
            let s = conns.dev_send(si).as_ref().ok_or_else(missing)?;
            (slot_out, flag_out, mark_out) = (s.slot(), s.flag(), s.mark());
        }
        if let Some(g) = self.gpu.as_mut() {
            // what the GPU watch releases should a peer be lost (noted
            // before the waits are queued: a failure on the way leaves them)
            let sides = [(flag_in, mark_in, st.recv_peer()), (flag_out, mark_out, st.send_peer())];
            for (f, m, peer) in sides {
                if let (Some(f), Some(m), Some(p)) = (f, m, peer) {
                    if !g.waits.contains(&f) {
                        g.waits.push(f);
                    }
                    if !g.peers.contains(&p) {
                        g.peers.push(p);
                    }
                    if !g.marks.iter().any(|&(a, _)| a == m) {
                        g.marks.push((m, p));
                    }
                }
            }
        }
        let Some(g) = &self.gpu else { return Err(Error::internal("device step without a device")) };
        let (dev, stream, k) = (&g.call.dev, io.stream, &g.call.kernels);
        if let Some((staging, h)) = stage_in {
            // SAFETY: the peeked host slot holds `bytes` (checked) until
            // released, which is after the sync below.
            unsafe { dev.copy(stream, staging, h, bytes)? };
        }
        let (s, d) = (src.map_or(0, |r| self.dptr(r)), dst.map_or(0, |r| self.dptr(r)));
        // SAFETY: regions were validated against their buffers in `new`
        // (device addresses of the caller's buffers, which it keeps until
        // the stream has passed the call, and the communicator's scratch,
        // kept while calls may use it); slots hold at least `n` elements;
        // flags are words of the slots' allocations, alive until every
        // receiver has read the connection (`Conns`); and a slot is written
        // only once its flag says empty, read only once it says full.
        unsafe {
            if let Some(f) = flag_in {
                dev.wait_value(stream, f, device::UNTIL_FULL)?;
            }
            if let Some(f) = flag_out {
                dev.wait_value(stream, f, device::UNTIL_EMPTY)?;
            }
            if n > 0 {
                match st {
                    Step::Send { .. } => dev.copy(stream, slot_out, s, bytes)?,
                    Step::Recv { .. } => dev.copy(stream, d, slot_in, bytes)?,
                    Step::RecvReduce { .. } => dev.launch(stream, k, Launch::Reduce { dst: d, a: s, b: slot_in, n })?,
                    Step::RecvReduceSend { .. } => dev.launch(
                        stream,
                        k,
                        Launch::RecvReduceSend { out: 0, next: slot_out, slot: slot_in, local: s, n },
                    )?,
                    Step::RecvReduceCopySend { .. } => dev.launch(
                        stream,
                        k,
                        Launch::RecvReduceSend { out: d, next: slot_out, slot: slot_in, local: s, n },
                    )?,
                    Step::RecvCopySend { .. } => {
                        dev.copy(stream, d, slot_in, bytes)?;
                        dev.copy(stream, slot_out, slot_in, bytes)?
                    }
                    Step::Copy { .. } => {
                        if s != d {
                            dev.copy(stream, d, s, bytes)?
                        }
                    }
                    Step::Reduce { .. } => dev.launch(stream, k, Launch::Reduce { dst: d, a: d, b: s, n })?,
                    // (empty: `n` is 0)
                    Step::Notify { .. } | Step::Wait { .. } => {}
                }
                if let Some(h) = io.host_out {
                    dev.copy(stream, h as u64, slot_out, bytes)?;
                }
            }
            if let Some(f) = flag_in {
                dev.write_value(stream, f, device::EMPTY)?;
            }
            if let Some(f) = flag_out {
                dev.write_value(stream, f, device::FULL)?;
            }
        }
        if let Some(si) = io.si {
            conns.dev_send(si).as_mut().ok_or_else(missing)?.count += 1;
        }
        if let Some(ri) = io.ri {
            conns.dev_recv(ri).as_mut().ok_or_else(missing)?.count += 1;
        }
        Ok(())
    }
}
