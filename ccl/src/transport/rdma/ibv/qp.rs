//! A libibverbs reliable-connected queue pair, with a completion queue
//! and completion channel of its own.

use super::sys;
use super::Port;
use crate::error::{Error, Result};
use crate::transport::rdma::verbs::{Completion, Done, LinkLayer, QpInfo, QueuePair, Remote, Sge, Status};
use std::os::fd::RawFd;
use std::sync::Arc;

/// Local ACK timeout: 4.096 us * 2^14, about 67 ms per try.
const ACK_TIMEOUT: u8 = 14;
/// Tries before a silent peer is a retry-exceeded error (7: the most).
const RETRIES: u8 = 7;

pub(super) struct IbvQp {
    port: Arc<Port>,
    channel: *mut sys::ibv_comp_channel,
    cq: *mut sys::ibv_cq,
    qp: *mut sys::ibv_qp,
    psn: u32,
    wcs: Vec<sys::ibv_wc>,
}

// SAFETY: the verbs objects are used by one owner at a time (this value),
// and libibverbs allows that from any thread.
unsafe impl Send for IbvQp {}

fn err(what: &str, port: &Port) -> Error {
    Error::transport(format!("rdma {}:{}: {what} failed ({})", port.name, port.port, std::io::Error::last_os_error()))
}

impl IbvQp {
    pub(super) fn new(port: Arc<Port>, depth: usize) -> Result<Self> {
        let lib = port.lib;
        // SAFETY: the port's open context.
        let channel = unsafe { (lib.create_comp_channel)(port.ctx) };
        if channel.is_null() {
            return Err(err("creating a completion channel", &port));
        }
        // SAFETY: a channel just made; its descriptor is set non-blocking.
        unsafe {
            let fd = (*channel).fd;
            libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK);
        }
        let cqe = (2 * depth + 1) as i32;
        // SAFETY: the open context and the channel made above.
        let cq = unsafe { (lib.create_cq)(port.ctx, cqe, std::ptr::null_mut(), channel, 0) };
        let mut q = IbvQp { port, channel, cq, qp: std::ptr::null_mut(), psn: rand::random::<u32>() & 0xff_ffff, wcs: Vec::new() };
        if cq.is_null() {
            return Err(err("creating a completion queue", &q.port));
        }
        let mut init = sys::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: sys::ibv_qp_cap {
                max_send_wr: depth as u32,
                max_recv_wr: depth as u32,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: the port's protection domain and a whole init attribute.
        q.qp = unsafe { (lib.create_qp)(q.port.pd, &mut init) };
        if q.qp.is_null() {
            return Err(err("creating a queue pair", &q.port));
        }
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: q.port.port,
            qp_access_flags: sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS;
        q.modify(&mut attr, mask, "moving a queue pair to INIT")?;
        Ok(q)
    }

    fn modify(&mut self, attr: &mut sys::ibv_qp_attr, mask: u32, what: &str) -> Result<()> {
        // SAFETY: our queue pair and a whole attribute.
        if unsafe { (self.port.lib.modify_qp)(self.qp, attr, mask as i32) } != 0 {
            return Err(err(what, &self.port));
        }
        Ok(())
    }

    fn ops(&self) -> &sys::ibv_context_ops {
        // SAFETY: the open context outlives this queue pair; its table never changes.
        unsafe { &(*self.port.ctx).ops }
    }
}

impl Drop for IbvQp {
    fn drop(&mut self) {
        let lib = self.port.lib;
        // SAFETY: the objects made in `new` (null ones skipped), destroyed once,
        // the queue pair before its completion queue before its channel.
        unsafe {
            if !self.qp.is_null() {
                (lib.destroy_qp)(self.qp);
            }
            if !self.cq.is_null() {
                (lib.destroy_cq)(self.cq);
            }
            (lib.destroy_comp_channel)(self.channel);
        }
    }
}

fn status(s: u32) -> Status {
    match s {
        sys::IBV_WC_SUCCESS => Status::Success,
        sys::IBV_WC_LOC_PROT_ERR => Status::LocalProtection,
        sys::IBV_WC_REM_ACCESS_ERR => Status::RemoteAccess,
        sys::IBV_WC_RNR_RETRY_EXC_ERR => Status::ReceiverNotReady,
        sys::IBV_WC_RETRY_EXC_ERR => Status::RetryExceeded,
        sys::IBV_WC_WR_FLUSH_ERR => Status::Flushed,
        c => Status::Other(c as i32),
    }
}

impl QueuePair for IbvQp {
    fn info(&self) -> QpInfo {
        let mut extra = [0u8; 40];
        extra[0] = self.port.mtu as u8;
        // SAFETY: a queue pair made in `new`.
        let qpn = unsafe { (*self.qp).qp_num };
        QpInfo { qpn, psn: self.psn, lid: self.port.lid, gid: self.port.gid.raw, link: self.port.link, extra }
    }

    fn connect(&mut self, peer: &QpInfo) -> Result<()> {
        let mtu = u32::from(peer.extra[0]).clamp(sys::IBV_MTU_256, sys::IBV_MTU_4096).min(self.port.mtu);
        let global = self.port.link == LinkLayer::Ethernet || peer.gid[..8] != self.port.gid.raw[..8];
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        attr.ah_attr.dlid = peer.lid;
        attr.ah_attr.port_num = self.port.port;
        if global {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = peer.gid;
            attr.ah_attr.grh.sgid_index = self.port.gid.index as u8;
            attr.ah_attr.grh.hop_limit = 255;
        }
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "moving a queue pair to RTR (is the peer's port reachable?)")?;
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            timeout: ACK_TIMEOUT,
            retry_cnt: RETRIES,
            rnr_retry: RETRIES,
            sq_psn: self.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "moving a queue pair to RTS")
    }

    unsafe fn post_write(&mut self, wr_id: u64, local: &[Sge], remote: Remote, imm: Option<u32>, signaled: bool)
        -> Result<()> {
        let mut sges = [sys::ibv_sge::default(); 2];
        if local.len() > sges.len() {
            return Err(Error::internal("rdma: a write of more than 2 pieces"));
        }
        for (s, g) in sges.iter_mut().zip(local) {
            *s = sys::ibv_sge { addr: g.addr as u64, length: g.len, lkey: g.lkey };
        }
        let mut wr = sys::ibv_send_wr {
            wr_id,
            sg_list: sges.as_mut_ptr(),
            num_sge: local.len() as i32,
            opcode: if imm.is_some() { sys::IBV_WR_RDMA_WRITE_WITH_IMM } else { sys::IBV_WR_RDMA_WRITE },
            send_flags: if signaled { sys::IBV_SEND_SIGNALED } else { 0 },
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        wr.wr.rdma.remote_addr = remote.addr;
        wr.wr.rdma.rkey = remote.rkey;
        let mut bad = std::ptr::null_mut();
        let post = self.ops().post_send.ok_or_else(|| Error::transport("rdma: the provider has no post_send"))?;
        // SAFETY: our queue pair and a whole request whose pieces the caller keeps
        // valid until it completes; libibverbs copies the request itself.
        let rc = unsafe { post(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            let e = std::io::Error::from_raw_os_error(rc);
            return Err(Error::transport(format!("rdma {}:{}: posting a write failed ({e})", self.port.name, self.port.port)));
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64) -> Result<()> {
        let mut wr = sys::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: std::ptr::null_mut(), num_sge: 0 };
        let mut bad = std::ptr::null_mut();
        let post = self.ops().post_recv.ok_or_else(|| Error::transport("rdma: the provider has no post_recv"))?;
        // SAFETY: our queue pair and a receive of no pieces (a write with immediate fills none).
        let rc = unsafe { post(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            let e = std::io::Error::from_raw_os_error(rc);
            return Err(Error::transport(format!("rdma {}:{}: posting a receive failed ({e})", self.port.name, self.port.port)));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<()> {
        self.wcs.resize(max.max(1), sys::ibv_wc::default());
        let poll = self.ops().poll_cq.ok_or_else(|| Error::transport("rdma: the provider has no poll_cq"))?;
        // SAFETY: our completion queue and room for `wcs.len()` completions.
        let n = unsafe { poll(self.cq, self.wcs.len() as i32, self.wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(err("polling a completion queue", &self.port));
        }
        for wc in &self.wcs[..n as usize] {
            let done = if wc.opcode == sys::IBV_WC_RECV_RDMA_WITH_IMM {
                // SAFETY: a completion of a write with immediate carries its immediate.
                Done::Recv { imm: u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }), len: wc.byte_len }
            } else {
                Done::Write
            };
            out.push(Completion { wr_id: wc.wr_id, status: status(wc.status), done });
        }
        Ok(())
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel made in `new`.
        unsafe { (*self.channel).fd }
    }

    fn arm(&mut self) -> Result<()> {
        let lib = self.port.lib;
        let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: our non-blocking channel: takes the events there are, acknowledged at once.
        while unsafe { (lib.get_cq_event)(self.channel, &mut cq, &mut ctx) } == 0 {
            // SAFETY: the event's completion queue (ours).
            unsafe { (lib.ack_cq_events)(cq, 1) };
        }
        let notify = self.ops().req_notify_cq.ok_or_else(|| Error::transport("rdma: the provider has no req_notify_cq"))?;
        // SAFETY: our completion queue.
        if unsafe { notify(self.cq, 0) } != 0 {
            return Err(err("arming a completion queue", &self.port));
        }
        Ok(())
    }

    #[cfg(test)]
    fn fail(&mut self) {
        let mut attr = sys::ibv_qp_attr { qp_state: sys::IBV_QPS_ERR, ..Default::default() };
        let _ = self.modify(&mut attr, sys::IBV_QP_STATE, "moving a queue pair to ERR");
    }
}
