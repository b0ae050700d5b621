//! A call's memory shared with sockets: places given for messages to be
//! read straight into, and messages lent from it taken back before it is
//! written.

use super::{Conns, Exec};
use crate::transport::{RecvVerbs, SendVerbs};
use crate::algo::Region;
use crate::op::ReduceOp;
use crate::Reduce;

impl<T: Reduce, O: ReduceOp<T>> Exec<T, O> {
    /// Gives receiving connection `ri`, where it reads sockets, a place in
    /// the call's memory for each message of step `i` of channel `c`, as
    /// the step begins: the slice of the region the step copies it into.
    /// The socket then reads each message that has not started to arrive
    /// straight there, saving the copy out of a slot. Only for steps
    /// [`Lending::lands`](crate::algo::lend::Lending::lands) allows; what earlier steps still send from that
    /// memory is taken back first.
    pub(super) fn give_places(&self, c: usize, i: usize, ri: usize, conns: &mut Conns) {
        let st = self.wiring.sched.channels[c][i];
        let Some(dst) = crate::algo::lend::landing(&st) else { return };
        if !conns.recv_at(ri).offers().lands {
            return;
        }
        let (size, se, len) = (std::mem::size_of::<T>(), self.slot_elems, st.len());
        if self.wiring.lending.takes_back[c][i] && !self.lent.is_empty() {
            self.take_back(self.layout.resolve(dst), conns);
        }
        for (k, off) in (0..len).step_by(se).enumerate() {
            let r = self.layout.resolve(Region::new(dst.buf, dst.off + off, se.min(len - off)));
            // SAFETY: a validated region of this call's buffers, the one
            // slot `k` of the step copies its message into; no other
            // channel's step touches it and this channel's later steps wait
            // for this one (`Lending::lands`), what earlier steps lent from
            // it was taken back above (`Lending::takes_back`), and a call that
            // fails has its places withdrawn (`Conns::forget_call_memory`)
            // before its buffers go back: nothing else touches the place
            // until the message is released.
            unsafe { conns.recv_at(ri).post_into(k, self.ptr(r) as *mut u8, r.len * size) };
        }
    }

    /// Takes back into their slots the messages lent from the call's
    /// buffers, not yet sent, that overlap resolved region `w`, which is
    /// about to be written ([`SendConn::reclaim`]).
    ///
    /// [`SendConn::reclaim`]: crate::transport::SendConn::reclaim
    pub(super) fn take_back(&self, w: Region, conns: &mut Conns) {
        let (p, bytes) = (self.ptr(w) as *const u8, w.len * std::mem::size_of::<T>());
        self.lent.iter().for_each(|&(l, _)| conns.send_at(l).reclaim(p, bytes));
    }
}
