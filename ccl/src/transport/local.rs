//! The in-process transport: ranks are threads of one process and every
//! connection is a slot FIFO in ordinary memory. Both ends of a connection
//! find the same FIFO in the fabric's table, whichever connects first.

use super::call_board::{CallBoard, Words};
use super::doorbell::{BellRef, Doorbell};
use super::fifo::{FifoMem, FifoRecv, FifoSend};
use super::{ConnKey, Geometry, RecvConn, SendConn, Transport};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The shared state of all threads of a local job.
pub struct Fabric {
    nslots: usize,
    slot_bytes: usize,
    bells: Vec<Arc<Doorbell>>,
    boards: Vec<CallBoard>,
    fifos: Mutex<HashMap<ConnKey, Arc<FifoMem>>>,
    down: AtomicBool,
    why: Mutex<String>,
}

impl Fabric {
    /// A fabric for `n` endpoints whose FIFOs have `nslots` slots of `slot_bytes`.
    pub fn new(n: usize, nslots: usize, slot_bytes: usize) -> Arc<Self> {
        Arc::new(Fabric {
            nslots,
            slot_bytes,
            bells: (0..n).map(|_| Arc::new(Doorbell::new())).collect(),
            boards: (0..n).map(|_| CallBoard::default()).collect(),
            fifos: Mutex::new(HashMap::new()),
            down: AtomicBool::new(false),
            why: Mutex::new(String::new()),
        })
    }

    /// Endpoint `me`'s view of the fabric.
    pub fn endpoint(self: &Arc<Self>, me: usize) -> LocalEndpoint {
        LocalEndpoint { fabric: Arc::clone(self), me }
    }

    /// Marks the job as failed (`why`) and wakes every sleeper, so that
    /// ranks waiting on a dead peer return an error instead of hanging.
    pub fn shut_down(&self, why: &str) {
        if let Ok(mut w) = self.why.lock() {
            if w.is_empty() {
                *w = why.to_string();
            }
        }
        self.down.store(true, Ordering::SeqCst);
        for b in &self.bells {
            b.ring();
        }
    }

    fn fifo(&self, key: ConnKey) -> Result<Arc<FifoMem>> {
        let mut map = self.fifos.lock().map_err(|_| Error::transport("fabric table poisoned"))?;
        if let Some(f) = map.get(&key) {
            return Ok(Arc::clone(f));
        }
        let f = FifoMem::new(self.nslots, self.slot_bytes).ok_or_else(|| {
            Error::transport(format!("cannot allocate {} slots of {} bytes", self.nslots, self.slot_bytes))
        })?;
        map.insert(key, Arc::clone(&f));
        Ok(f)
    }

    fn bell_of(&self, ep: usize) -> Result<BellRef> {
        match self.bells.get(ep) {
            Some(b) => Ok(Arc::clone(b) as BellRef),
            None => Err(Error::transport(format!("no endpoint {ep} in this fabric"))),
        }
    }
}

/// One thread's handle on the fabric.
pub struct LocalEndpoint {
    fabric: Arc<Fabric>,
    me: usize,
}

impl Transport for LocalEndpoint {
    fn name(&self) -> &'static str {
        "local"
    }

    fn can_connect(&self, from: usize, to: usize) -> bool {
        from < self.fabric.bells.len() && to < self.fabric.bells.len()
    }

    fn connect_send(&self, key: ConnKey, _ring: Geometry) -> Result<SendConn> {
        Ok(FifoSend::new(self.fabric.fifo(key)?, self.fabric.bell_of(key.to)?).into())
    }

    fn connect_recv(&self, key: ConnKey, _ring: Geometry) -> Result<RecvConn> {
        Ok(FifoRecv::new(self.fabric.fifo(key)?, self.fabric.bell_of(key.from)?).into())
    }

    fn bell(&self) -> &Doorbell {
        &self.fabric.bells[self.me]
    }

    fn post_call(&self, comm: u64, fp: &Words) {
        if let Some(b) = self.fabric.boards.get(self.me) {
            b.post(comm, fp);
        }
    }

    fn peer_call(&self, peer: usize, comm: u64, seq: u64) -> Option<Words> {
        self.fabric.boards.get(peer).filter(|_| peer != self.me)?.get(comm, seq)
    }

    fn sees_calls_of(&self, peer: usize) -> bool {
        peer < self.fabric.boards.len()
    }

    fn check_alive(&self, _peers: &[usize]) -> Result<()> {
        if self.fabric.down.load(Ordering::SeqCst) {
            let why = self.fabric.why.lock().map(|w| w.clone()).unwrap_or_default();
            return Err(Error::transport(format!("the job is shutting down: {why}")));
        }
        Ok(())
    }
}
