//! The one error type of ccl.
//!
//! Every error carries where it happened — this rank, the peer when there is
//! one, the collective and its sequence number on the communicator — and
//! what happened ([`ErrorKind`]). Its message reads like
//! `rank 3, all_reduce #12, peer 4: timed out after 300 s waiting to receive`.

use std::fmt;

/// `Result` with [`Error`] as the error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A ccl error: what went wrong ([`ErrorKind`]) and where.
#[derive(Clone, PartialEq, thiserror::Error)]
#[error("{}{}", .0.ctx, .0.kind)]
pub struct Error(Box<Repr>);

/// Debug prints the message, so `fn main() -> ccl::Result<()>` reports
/// errors readably.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Boxed so that `Result<T>` stays small on the hot path.
#[derive(Debug, Clone, PartialEq)]
struct Repr {
    ctx: Context,
    kind: ErrorKind,
}

/// Where an error happened. Each part is optional: a configuration error has
/// no peer and no collective.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// This process's rank in the communicator.
    pub rank: Option<usize>,
    /// The collective or point-to-point call (`"all_reduce"`, `"send"`, ...).
    pub op: Option<&'static str>,
    /// The call's sequence number on its communicator, from 0.
    pub seq: Option<u64>,
    /// The peer rank involved, where there is one.
    pub peer: Option<usize>,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(r) = self.rank {
            parts.push(format!("rank {r}"));
        }
        match (self.op, self.seq) {
            (Some(op), Some(seq)) => parts.push(format!("{op} #{seq}")),
            (Some(op), None) => parts.push(op.to_string()),
            (None, Some(seq)) => parts.push(format!("call #{seq}")),
            (None, None) => {}
        }
        if let Some(p) = self.peer {
            parts.push(format!("peer {p}"));
        }
        if parts.is_empty() {
            Ok(())
        } else {
            write!(f, "{}: ", parts.join(", "))
        }
    }
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An argument is out of its domain (a message says which).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A buffer has the wrong number of elements.
    #[error("{what} holds {got} elements but this call needs {expected}")]
    BufferSize {
        /// Which buffer (`"recv buffer"`, ...).
        what: &'static str,
        /// Elements required.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A buffer that is split evenly across ranks is not a multiple of the rank count.
    #[error("buffer of {len} elements cannot be split evenly over {ranks} ranks")]
    NotDivisible {
        /// Elements given.
        len: usize,
        /// Ranks in the communicator.
        ranks: usize,
    },
    /// A root or peer rank is not in the communicator.
    #[error("{what} {rank} is out of range for a communicator of {size} ranks")]
    RankOutOfRange {
        /// `"root"` or `"peer"`.
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// Ranks in the communicator.
        size: usize,
    },
    /// A peer sent a message whose size does not match this rank's call.
    #[error("received {got} bytes where this call expects {expected} (do all ranks make the same call with the same count and type?)")]
    MessageSize {
        /// Bytes this rank expected.
        expected: usize,
        /// Bytes that arrived.
        got: usize,
    },
    /// A peer made a different call (another collective, type, count,
    /// operator, root, or a different order of calls).
    #[error("this rank called {ours} but the peer called {theirs}")]
    Mismatch {
        /// This rank's call.
        ours: String,
        /// The peer's call, as its fingerprint tells.
        theirs: String,
    },
    /// The call did not finish before its deadline.
    #[error("timed out after {secs:.1} s {waiting}")]
    Timeout {
        /// Seconds waited.
        secs: f64,
        /// What the call was waiting for.
        waiting: String,
    },
    /// A configuration variable has a value ccl cannot use.
    #[error("{var}={value:?}: {why}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it is rejected.
        why: String,
    },
    /// A transport failed to connect or move data.
    #[error("transport: {0}")]
    Transport(String),
    /// A payload arrived with a checksum that does not match (`CCL_CHECKSUM=1`).
    #[error("corrupted data on the {link} link: payload checksum mismatch")]
    Corrupt {
        /// Which link.
        link: String,
    },
    /// `abort()` was called on the communicator.
    #[error("the communicator was aborted")]
    Aborted,
    /// A file in shared memory could not be given its space: `/dev/shm`
    /// is smaller than the job needs.
    #[error(
        "{path} needs {need} bytes but /dev/shm has {free} free: give the job more shared memory \
         (docker run --shm-size=1g, or a larger tmpfs on /dev/shm), or lower CCL_BUFFSIZE (slot memory \
         per connection), or set CCL_SHM_DISABLE=1 to connect through sockets"
    )]
    ShmFull {
        /// The file.
        path: String,
        /// Bytes it needs.
        need: u64,
        /// Bytes free in /dev/shm.
        free: u64,
    },
    /// A peer process or host is gone.
    #[error("lost rank {rank} on {host}: {why}")]
    PeerLost {
        /// The lost rank.
        rank: usize,
        /// Its host identity.
        host: String,
        /// How the loss was noticed.
        why: String,
    },
    /// The communicator failed earlier and refuses further calls.
    #[error("communicator is unusable after an earlier error: {0}")]
    Broken(String),
    /// The GPU path: no driver or device, a CUDA call that failed, or a
    /// device buffer that does not fit the call.
    #[error("GPU: {0}")]
    Device(String),
    /// Something the library does not support (yet).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A bug in ccl: a schedule that does not fit its buffers, and the like.
    #[error("internal error (a bug in ccl, please report): {0}")]
    Internal(String),
}

impl Error {
    /// A [`ErrorKind::Device`] error.
    pub(crate) fn device(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::Device(msg.into()))
    }

    /// An error of `kind` with no context yet.
    pub fn new(kind: ErrorKind) -> Self {
        Error(Box::new(Repr { ctx: Context::default(), kind }))
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0.kind
    }

    /// Where it happened.
    pub fn context(&self) -> &Context {
        &self.0.ctx
    }

    /// Sets the rank, keeping one already set.
    pub fn at_rank(mut self, rank: usize) -> Self {
        self.0.ctx.rank.get_or_insert(rank);
        self
    }

    /// Sets the collective and sequence number, keeping ones already set.
    pub fn in_call(mut self, op: &'static str, seq: u64) -> Self {
        self.0.ctx.op.get_or_insert(op);
        self.0.ctx.seq.get_or_insert(seq);
        self
    }

    /// Sets the peer, keeping one already set.
    pub fn with_peer(mut self, peer: usize) -> Self {
        self.0.ctx.peer.get_or_insert(peer);
        self
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument(msg.into()))
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal(msg.into()))
    }

    pub(crate) fn transport(msg: impl Into<String>) -> Self {
        Error::new(ErrorKind::Transport(msg.into()))
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Error::new(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_rank_call_and_peer() {
        let e = Error::new(ErrorKind::MessageSize { expected: 8, got: 4 })
            .with_peer(4)
            .in_call("all_reduce", 12)
            .at_rank(3);
        let s = e.to_string();
        assert!(s.starts_with("rank 3, all_reduce #12, peer 4: received 4 bytes"), "{s}");
    }

    #[test]
    fn context_is_kept_once_set() {
        let e = Error::invalid("x").at_rank(1).at_rank(2);
        assert_eq!(e.context().rank, Some(1));
        assert_eq!(Error::invalid("bad").to_string(), "invalid argument: bad");
    }
}
