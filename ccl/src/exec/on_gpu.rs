//! The executor's steps on device buffers: opening a connection's device
//! slots (the hello, see [`device`](super::device)) and running one step
//! as copies and kernels on the call's stream.

use super::{device, Conns, Exec};
use crate::algo::{Region, Step};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::plan::fingerprint;
use crate::Reduce;

/// A device step's slots: the host slots claimed and their connections.
pub(super) struct Io {
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
            let nslots = conns.send_at(si).nslots();
            // SAFETY: a reserved slot holds at least `slot_bytes` (checked
            // when connecting) and is ours until posted.
            let host = unsafe { std::slice::from_raw_parts_mut(p, slot_bytes) };
            let staged = nslots.is_none();
            let (mut ds, bytes) = device::DevSend::open(&dev, staged, nslots.unwrap_or(1), slot_bytes, host)
                .map_err(|e| e.with_peer(peer))?;
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
            let mut dr = device::DevRecv::accept(&dev, hello, fp, ours, attached).map_err(|e| e.with_peer(peer))?;
            // SAFETY: as for the sending side above.
            dr.pinned = unsafe { device::Pinned::new(&dev, conns.recv_at(ri).staging_memory()) };
            conns.recv_at(ri).release();
            *conns.dev_recv(ri) = Some(dr);
        }
        Ok(true)
    }

    /// One step of a device call: copies and kernels on the call's stream,
    /// waited for before the slots go back to the transports.
    pub(super) fn gpu_step(
        &mut self,
        st: Step,
        src: Option<Region>,
        dst: Option<Region>,
        n: usize,
        io: Io,
        conns: &mut Conns,
    ) -> Result<()> {
        use crate::gpu::Launch;
        let Some(g) = &self.gpu else { return Err(Error::internal("device step without a device")) };
        let (dev, stream, k) = (&g.call.dev, g.call.stream, &g.call.kernels);
        let bytes = n * std::mem::size_of::<T>();
        let missing = || Error::internal("device step on a connection without device slots");
        let slot_in = match io.ri {
            Some(ri) => {
                let r = conns.dev_recv(ri).as_ref().ok_or_else(missing)?;
                if let (device::Source::Staged(m), Some(h)) = (&r.source, io.host_in) {
                    // SAFETY: the peeked host slot holds `bytes` (checked) until
                    // released, which is after the sync below.
                    unsafe { dev.copy(stream, m.ptr, h as u64, bytes)? };
                }
                r.slot()
            }
            None => 0,
        };
        let (slot_out, staged_out) = match io.si {
            Some(si) => {
                let s = conns.dev_send(si).as_ref().ok_or_else(missing)?;
                (s.slot(), s.staged)
            }
            None => (0, false),
        };
        let (s, d) = (src.map_or(0, |r| self.dptr(r)), dst.map_or(0, |r| self.dptr(r)));
        if n > 0 {
            // SAFETY: regions were validated against their buffers in `new`
            // (device addresses of the caller's buffers and our scratch), slots
            // hold at least `n` elements, and everything queued here has run
            // by the sync below, before any slot or buffer is handed on.
            unsafe {
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
                if let (true, Some(h)) = (staged_out, io.host_out) {
                    dev.copy(stream, h as u64, slot_out, bytes)?;
                }
            }
        }
        dev.sync(stream)?;
        if let Some(si) = io.si {
            conns.dev_send(si).as_mut().ok_or_else(missing)?.count += 1;
        }
        if let Some(ri) = io.ri {
            conns.dev_recv(ri).as_mut().ok_or_else(missing)?.count += 1;
        }
        Ok(())
    }
}
