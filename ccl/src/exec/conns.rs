//! A communicator's connections, made on first use and kept for its life.

use super::device::{DevMem, DevRecv, DevSend};
use crate::plan::fingerprint::Fingerprint;
use crate::plan::DevCall;
use crate::error::{Error, Result};
use crate::transport::call_board::{Words, ENTRIES};
use crate::transport::doorbell::Doorbell;
use crate::transport::{ConnKey, Geometry, RecvConn, RecvVerbs, Registry, SendConn, SendVerbs};
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

/// What a communicator's disputed calls are posted under: its id changed
/// so ([`Conns::post_disagreement`]).
const DISPUTES: u64 = 0x5eed_d15b_u64 << 32;

/// The connections of one communicator on this rank.
pub struct Conns {
    /// Device slots of each connection a device call has used; declared
    /// first so they drop (unpinning staging memory) before the connections.
    dsends: Vec<Option<DevSend>>,
    drecvs: Vec<Option<DevRecv>>,
    /// The stream of the last device call, which the next one waits for
    /// (calls on a communicator run in order on the GPU, whatever their
    /// streams), and device scratch kept from call to call.
    dev_last: Option<crate::gpu::Stream>,
    dev_scratch: Option<DevMem>,
    /// Scratch outgrown, kept until the communicator goes: calls queued
    /// or captured before may still use it.
    dev_retired: Vec<DevMem>,
    /// Streams of the channels of multi-channel device calls, kept.
    dev_streams: Vec<crate::gpu::Stream>,
    /// How device calls finished by the proxy are ordered ([`Proxy`]).
    pub(crate) proxy: Proxy,
    reg: Arc<Registry>,
    comm: u64,
    me: usize,
    endpoints: Arc<[usize]>,
    ring: Geometry,
    send_idx: HashMap<(usize, u32), usize>,
    sends: Vec<SendConn>,
    recv_idx: HashMap<(usize, u32), usize>,
    recvs: Vec<RecvConn>,
    /// This rank's last collectives on the communicator, by number: call
    /// number + 1 (0: none) and fingerprint.
    calls: [(u64, Words); ENTRIES],
}

/// Bytes of each proxy word (a line of its own).
const PROXY_WORD: usize = 64;

/// Device calls finished by the communicator's proxy thread: those over
/// a staged (tcp) connection, whose bytes pass through the host, and every
/// later one (or every one, `CCL_GPU_PROXY=1`). Such a call queues on its
/// caller's stream only two words' operations: "call `n` starts here"
/// and "wait until call `n` is done"; its channels' streams wait for the
/// first, the last of them writes the second, and the proxy queues the
/// work between as the peers' messages and the host slots allow.
#[derive(Debug, Default)]
pub(crate) struct Proxy {
    /// Whether device calls go through the proxy from now on (the
    /// channels' streams are shared, so calls cannot leave it).
    pub on: bool,
    /// The start and done words, on the GPU of the calls.
    words: Option<DevMem>,
    /// Tickets issued, and the last one whose work is all queued.
    issued: u64,
    pub queued: u64,
}

/// A proxied call's number and the words its streams wait on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    pub n: u64,
    pub start: u64,
    pub done: u64,
}

impl Ticket {
    /// What the watch writes to release a wait on the done word.
    pub fn released(&self) -> u64 {
        self.n + (1 << 32)
    }
}

impl Drop for Conns {
    fn drop(&mut self) {
        if let Some(s) = self.dev_last.take() {
            // the slots and scratch go below: wait for the calls still using them
            let _ = s.synchronize();
        }
        self.drain_device_slots(std::time::Duration::from_secs(2));
    }
}

impl Conns {
    /// Connections of communicator `comm` for group rank `me`; group rank
    /// `r` is transport endpoint `endpoints[r]`; connections are cut as `ring`.
    pub fn new(reg: Arc<Registry>, comm: u64, me: usize, endpoints: Arc<[usize]>, ring: Geometry) -> Self {
        Conns {
            reg,
            comm,
            me,
            endpoints,
            ring,
            send_idx: HashMap::default(),
            sends: Vec::new(),
            recv_idx: HashMap::default(),
            recvs: Vec::new(),
            dsends: Vec::new(),
            drecvs: Vec::new(),
            dev_last: None,
            dev_scratch: None,
            dev_retired: Vec::new(),
            dev_streams: Vec::new(),
            proxy: Proxy::default(),
            calls: [(0, [0; 4]); ENTRIES],
        }
    }

    /// Notes collective `fp` as this rank starts it, and posts it where
    /// the peers of its host can compare it with theirs ([`CallBoard`]).
    ///
    /// [`CallBoard`]: crate::transport::call_board::CallBoard
    pub fn post_call(&mut self, fp: &Words) {
        self.calls[fp[3] as usize % ENTRIES] = (fp[3].wrapping_add(1), *fp);
        self.reg.post_call(self.comm, fp);
    }

    /// Posts `theirs`, what a peer made of one of this rank's posted
    /// calls (of the same number) but otherwise, beside it, as this rank
    /// fails that call: ranks of its host waiting on this one, whose call
    /// is this rank's, then find the disagreement when they compare calls
    /// ([`disagreement`](Self::disagreement)), naming the other view,
    /// instead of waiting for a message that will not come.
    pub fn post_disagreement(&mut self, theirs: &Words) {
        if self.own_call(theirs[3]).is_some_and(|o| o != *theirs) {
            self.reg.post_call(self.comm ^ DISPUTES, theirs);
        }
    }

    /// This rank's call number `seq`, if it is among the last ones.
    fn own_call(&self, seq: u64) -> Option<Words> {
        let (s, fp) = self.calls[seq as usize % ENTRIES];
        (s == seq.wrapping_add(1)).then_some(fp)
    }

    /// What group rank `peer` posted as call number `seq`, where this rank
    /// can see it (a peer of its host) or was told it (one of another).
    fn peer_call(&self, peer: usize, seq: u64) -> Option<Words> {
        self.reg.peer_call(*self.endpoints.get(peer)?, self.comm, seq)
    }

    /// Tells group rank `peer` this rank's last calls, where it cannot
    /// read them itself (a peer on another host): once for each latest
    /// call, so that a peer stuck on this rank can compare.
    pub fn tell_calls(&self, peer: usize) -> Result<()> {
        let Some(&ep) = self.endpoints.get(peer) else { return Ok(()) };
        self.reg.tell_calls(ep, self.comm, &self.recent())
    }

    /// This rank's last calls, in the order it made them.
    fn recent(&self) -> Vec<Words> {
        let mut ours: Vec<Words> = self.calls.iter().filter(|c| c.0 != 0).map(|c| c.1).collect();
        ours.sort_unstable_by_key(|w| w[3]);
        ours
    }

    /// Whether group rank `peer` has posted this rank's last call (true
    /// where this rank made none).
    pub fn posted_last(&self, peer: usize) -> bool {
        self.recent().last().is_none_or(|c| self.peer_call(peer, c[3]).is_some())
    }

    /// A call among this rank's last ones that group rank `peer` made
    /// otherwise, as far as this rank can see: (ours, theirs), the
    /// earliest first. Where the peer made it as this rank did but failed
    /// it, sent it otherwise ([`post_disagreement`](Self::post_disagreement)),
    /// theirs is what it was sent, marked [`disputed`](Fingerprint::disputed).
    pub fn disagreement(&self, peer: usize) -> Option<(Words, Words)> {
        self.recent().into_iter().find_map(|o| {
            let theirs = self.peer_call(peer, o[3]).filter(|t| *t != o).or_else(|| {
                let ep = *self.endpoints.get(peer)?;
                let sent = self.reg.peer_call(ep, self.comm ^ DISPUTES, o[3])?;
                (sent != o).then(|| Fingerprint::disputed(sent))
            })?;
            Some((o, theirs))
        })
    }

    /// The two calls to name where group rank `peer` sent `theirs` to a
    /// call of this rank's that is `ours`: the same call number on both
    /// sides where it can be found (a message left over from an earlier
    /// call was sent to this rank's call of that number; a peer ahead has
    /// posted what it made of this rank's call).
    pub fn explain(&self, peer: usize, ours: &Words, theirs: &Words) -> (Words, Words) {
        if theirs[3] < ours[3] {
            if let Some(o) = self.own_call(theirs[3]).filter(|o| o != theirs) {
                return (o, *theirs);
            }
        } else if theirs[3] > ours[3] {
            if let Some(t) = self.peer_call(peer, ours[3]).filter(|t| t != ours) {
                return (*ours, t);
            }
        }
        (*ours, *theirs)
    }

    fn key(&self, from: usize, to: usize, channel: u32) -> Result<ConnKey> {
        let ep = |r: usize| {
            self.endpoints.get(r).copied().ok_or_else(|| Error::internal(format!("rank {r} outside the group")))
        };
        Ok(ConnKey { comm: self.comm, from: ep(from)?, to: ep(to)?, channel })
    }

    /// Index of the sending connection to `peer` on `channel`.
    pub fn send(&mut self, peer: usize, channel: u32) -> Result<usize> {
        if let Some(&i) = self.send_idx.get(&(peer, channel)) {
            return Ok(i);
        }
        let key = self.key(self.me, peer, channel)?;
        let c = self.reg.connect_send(key, self.ring).map_err(|e| e.with_peer(peer))?;
        self.check_slots(c.slot_bytes(), peer)?;
        self.sends.push(c);
        self.dsends.push(None);
        self.send_idx.insert((peer, channel), self.sends.len() - 1);
        Ok(self.sends.len() - 1)
    }

    /// Index of the receiving connection from `peer` on `channel`.
    pub fn recv(&mut self, peer: usize, channel: u32) -> Result<usize> {
        if let Some(&i) = self.recv_idx.get(&(peer, channel)) {
            return Ok(i);
        }
        let key = self.key(peer, self.me, channel)?;
        let c = self.reg.connect_recv(key, self.ring).map_err(|e| e.with_peer(peer))?;
        self.check_slots(c.slot_bytes(), peer)?;
        self.recvs.push(c);
        self.drecvs.push(None);
        self.recv_idx.insert((peer, channel), self.recvs.len() - 1);
        Ok(self.recvs.len() - 1)
    }

    /// The sending connection at `i` (from [`send`](Self::send)).
    pub fn send_at(&mut self, i: usize) -> &mut SendConn {
        &mut self.sends[i]
    }

    /// Whether sending connection `i` sends straight from a call's memory
    /// ([`Offers::lends`](crate::transport::Offers::lends)).
    pub fn send_lends(&self, i: usize) -> bool {
        self.sends[i].offers().lends
    }

    /// The receiving connection at `i` (from [`recv`](Self::recv)).
    pub fn recv_at(&mut self, i: usize) -> &mut RecvConn {
        &mut self.recvs[i]
    }

    /// The device slots of sending connection `i`, once a device call opened them.
    pub(crate) fn dev_send(&mut self, i: usize) -> &mut Option<DevSend> {
        &mut self.dsends[i]
    }

    /// The device slots of receiving connection `i`, once a device call opened them.
    pub(crate) fn dev_recv(&mut self, i: usize) -> &mut Option<DevRecv> {
        &mut self.drecvs[i]
    }

    /// Waits (up to `within`) until every receiver in another process has
    /// read the device slots it may still be reading (every slot's flag
    /// says empty), so they are not freed under it (peers in this process
    /// hold them alive themselves).
    fn drain_device_slots(&mut self, within: std::time::Duration) {
        let until = std::time::Instant::now() + within;
        for (s, d) in self.sends.iter_mut().zip(&self.dsends) {
            if let Some(d) = d.as_ref().filter(|d| !d.staged && s.offers().read_elsewhere) {
                while !d.drained() && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        }
    }

    /// Orders device call `call` after this communicator's previous one
    /// (on the GPU: the host waits for neither), unless it is being
    /// `captured` into a graph, whose runs the stream they are launched on
    /// orders; returns device scratch of at least `bytes` (0: none), and a
    /// stream for each of `channels` that starts after the work queued so
    /// far on the call's stream (the call's own stream where there is one
    /// channel). Scratch and streams are kept for later calls.
    pub(crate) fn dev_prepare(
        &mut self,
        call: &DevCall,
        bytes: usize,
        channels: usize,
        captured: bool,
    ) -> crate::Result<(u64, smallvec::SmallVec<[u64; 4]>)> {
        if !captured {
            self.follow_last(call)?;
        }
        let scratch = self.dev_scratch(call, bytes)?;
        let raw = call.stream.raw();
        if channels <= 1 {
            return Ok((scratch, smallvec::smallvec![raw]));
        }
        if self.dev_streams.first().is_some_and(|s| s.dev().context() != call.dev.context()) {
            self.dev_streams.clear();
        }
        while self.dev_streams.len() < channels {
            let g = crate::gpu::Gpu { dev: std::sync::Arc::clone(&call.dev) };
            self.dev_streams.push(g.stream()?);
        }
        let streams: smallvec::SmallVec<[u64; 4]> = self.dev_streams[..channels].iter().map(|s| s.raw()).collect();
        for &s in &streams {
            call.dev.join(s, raw)?;
        }
        Ok((scratch, streams))
    }

    /// Makes a device call that the proxy finishes (see [`Proxy`]) wait
    /// on its caller's stream: the stream marks where the call starts and
    /// waits until the call is done; returns the call's ticket and words.
    /// Scratch is returned as by [`dev_prepare`](Self::dev_prepare); the
    /// channels' streams come later, from [`dev_channels`](Self::dev_channels).
    pub(crate) fn dev_proxied(&mut self, call: &DevCall, bytes: usize) -> crate::Result<(u64, Ticket)> {
        self.follow_last(call)?;
        let scratch = self.dev_scratch(call, bytes)?;
        if self.proxy.words.as_ref().is_none_or(|m| m.dev().context() != call.dev.context()) {
            let m = DevMem::new(&call.dev, 2 * PROXY_WORD)?;
            for w in [m.ptr, m.ptr + PROXY_WORD as u64] {
                // SAFETY: aligned words of the fresh allocation, which no queued work uses yet.
                unsafe { call.dev.write_word(w, 0)? };
            }
            self.dev_retired.extend(self.proxy.words.replace(m));
        }
        let base = self.proxy.words.as_ref().map_or(0, |m| m.ptr);
        let t = Ticket { n: self.proxy.issued + 1, start: base, done: base + PROXY_WORD as u64 };
        let raw = call.stream.raw();
        // SAFETY: words of the communicator's proxy memory, kept while calls may use it.
        unsafe {
            call.dev.write_value(raw, t.start, t.n)?;
            call.dev.wait_value(raw, t.done, crate::gpu::Until::AtLeast(t.n))?;
        }
        self.proxy.issued = t.n;
        self.proxy.on = true;
        Ok((scratch, t))
    }

    /// The streams of a proxied call's `channels` (at least one, never
    /// its caller's stream), each waiting until the caller's stream has
    /// reached the call (ticket `t`); `None` while an earlier proxied call
    /// has not queued all its work yet (their streams are shared).
    pub(crate) fn dev_channels(
        &mut self,
        call: &DevCall,
        channels: usize,
        t: Ticket,
    ) -> crate::Result<Option<smallvec::SmallVec<[u64; 4]>>> {
        if self.proxy.queued + 1 != t.n {
            return Ok(None);
        }
        if self.dev_streams.first().is_some_and(|s| s.dev().context() != call.dev.context()) {
            self.dev_streams.clear();
        }
        while self.dev_streams.len() < channels.max(1) {
            let g = crate::gpu::Gpu { dev: std::sync::Arc::clone(&call.dev) };
            self.dev_streams.push(g.stream()?);
        }
        let streams: smallvec::SmallVec<[u64; 4]> =
            self.dev_streams[..channels.max(1)].iter().map(|s| s.raw()).collect();
        for &s in &streams {
            // SAFETY: as in `dev_proxied`.
            unsafe { call.dev.wait_value(s, t.start, crate::gpu::Until::AtLeast(t.n))? };
        }
        Ok(Some(streams))
    }

    /// Makes `call`'s stream wait for the previous call's.
    fn follow_last(&mut self, call: &DevCall) -> crate::Result<()> {
        let raw = call.stream.raw();
        if let Some(last) = &self.dev_last {
            if last.raw() != raw || last.dev().context() != call.dev.context() {
                if last.dev().context() == call.dev.context() {
                    call.dev.join(raw, last.raw())?;
                } else {
                    last.synchronize()?;
                }
            }
        }
        self.dev_last = Some(call.stream.clone());
        Ok(())
    }

    /// Device scratch of at least `bytes` for `call` (0: none).
    fn dev_scratch(&mut self, call: &DevCall, bytes: usize) -> crate::Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        match &self.dev_scratch {
            Some(m) if m.bytes >= bytes && m.dev().context() == call.dev.context() => Ok(m.ptr),
            _ => {
                self.dev_retired.extend(self.dev_scratch.take());
                let m = DevMem::new(&call.dev, bytes)?;
                let ptr = m.ptr;
                self.dev_scratch = Some(m);
                Ok(ptr)
            }
        }
    }

    /// A number naming sending connection `i` among all of this communicator's.
    pub fn send_id(&self, i: usize) -> usize {
        2 * i
    }

    /// A number naming receiving connection `i` among all of this communicator's.
    pub fn recv_id(&self, i: usize) -> usize {
        2 * i + 1
    }

    /// Bytes per slot every connection provides.
    pub fn slot_bytes(&self) -> usize {
        self.ring.slot_bytes
    }

    /// A connection whose slots hold less than the group's is an error.
    fn check_slots(&self, got: usize, peer: usize) -> Result<()> {
        if got < self.ring.slot_bytes {
            let e = Error::transport(format!("slots of {got} B, need {}", self.ring.slot_bytes));
            return Err(e.with_peer(peer));
        }
        Ok(())
    }

    /// Whether any connection learns readiness by a system call, not by a
    /// look at memory ([`Offers::pollable`](crate::transport::Offers::pollable)).
    pub fn any_pollable(&self) -> bool {
        self.sends.iter().any(|s| s.offers().pollable) || self.recvs.iter().any(|r| r.offers().pollable)
    }

    /// Whether any of `uses` (by [`send_id`](Self::send_id) and
    /// [`recv_id`](Self::recv_id)) is [pollable](Self::any_pollable).
    pub fn any_pollable_of(&self, uses: &[usize]) -> bool {
        uses.iter().any(|&u| match u % 2 {
            0 => self.sends.get(u / 2).is_some_and(|s| s.offers().pollable),
            _ => self.recvs.get(u / 2).is_some_and(|r| r.offers().pollable),
        })
    }

    /// This rank's doorbell.
    pub fn bell(&self) -> &Doorbell {
        self.reg.bell()
    }

    /// Sleeps until woken (see [`Registry::sleep`]).
    pub fn sleep(&self, seen: u32, timeout: std::time::Duration) {
        self.reg.sleep(seen, timeout)
    }

    /// Leaves word everywhere that endpoint `lost` is gone, so ranks that
    /// find this one gone next can name the root cause.
    pub fn publish_lost(&mut self, lost: usize) {
        self.reg.publish_lost(lost);
        self.sends.iter_mut().for_each(|s| s.announce_lost(lost));
    }

    /// Pushes staged outgoing data on every connection.
    pub fn flush(&mut self) -> Result<()> {
        self.sends.iter_mut().try_for_each(|s| s.flush())
    }

    /// Lets go of every call's memory: drops every message still waiting
    /// to be sent from it ([`SendVerbs::forget_lent`]) and takes back every
    /// place in it given for a message to arrive in ([`RecvVerbs::withdraw`]):
    /// the calls have failed.
    pub fn forget_call_memory(&mut self) {
        self.sends.iter_mut().for_each(|s| s.forget_lent());
        self.recvs.iter_mut().for_each(|r| r.withdraw())
    }

    /// Whether the transports are up and the group ranks `peers` alive.
    pub fn check_alive(&self, peers: &[usize]) -> Result<()> {
        alive(&self.reg, &self.endpoints, peers)
    }

    /// [`check_alive`](Self::check_alive) of `peers`, as a check to ask
    /// from another thread (the GPU watch's).
    pub(crate) fn liveness(&self, peers: Vec<usize>) -> Box<dyn Fn() -> Result<()> + Send> {
        let (reg, endpoints) = (Arc::clone(&self.reg), Arc::clone(&self.endpoints));
        Box::new(move || alive(&reg, &endpoints, &peers))
    }

    /// This rank, in the group.
    pub(crate) fn me(&self) -> usize {
        self.me
    }
}

/// Whether `reg`'s transports are up and group ranks `peers` (endpoints
/// `endpoints[rank]`) alive.
fn alive(reg: &Registry, endpoints: &[usize], peers: &[usize]) -> Result<()> {
    let eps: Vec<usize> = peers.iter().filter_map(|&r| endpoints.get(r).copied()).collect();
    reg.check_alive(&eps).map_err(|e| match e.kind() {
        crate::ErrorKind::PeerLost { rank, .. } => {
            let group_rank = endpoints.iter().position(|ep| ep == rank).unwrap_or(*rank);
            e.with_peer(group_rank)
        }
        _ => e,
    })
}
