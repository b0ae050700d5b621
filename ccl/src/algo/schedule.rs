//! The schedule IR: what one rank does, per channel, as an ordered list of
//! steps over regions of its buffers. NCCL's primitive names.

/// Which buffer a region lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The caller's send buffer.
    Input,
    /// The caller's receive buffer.
    Output,
    /// Scratch space owned by the call, [`Schedule::scratch`] elements long.
    Scratch,
    /// Rank `r`'s send buffer, where every rank maps every other's
    /// ([`shared`](super::shared) schedules), as it lies on rank `r`
    /// (resolved: never used in place).
    PeerInput(u32),
    /// Rank `r`'s receive buffer (in place: its one buffer), as it lies on
    /// rank `r`, resolved.
    PeerOutput(u32),
}

impl Buf {
    /// The rank whose buffer it is, for a peer's (reached through shared
    /// memory).
    pub fn peer(self) -> Option<usize> {
        match self {
            Buf::PeerInput(q) | Buf::PeerOutput(q) => usize::try_from(q).ok(),
            _ => None,
        }
    }
}

/// `len` elements of `buf` from element `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub off: usize,
    /// Number of elements.
    pub len: usize,
}

impl Region {
    /// A region of `buf`.
    pub const fn new(buf: Buf, off: usize, len: usize) -> Self {
        Region { buf, off, len }
    }
    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.off + self.len
    }
    /// Whether the two share an element (both resolved, or both not).
    pub fn overlaps(&self, other: &Region) -> bool {
        self.buf == other.buf && self.off < other.end() && other.off < self.end()
    }
}

/// One step of a schedule. Peers are ranks of the communicator; every
/// message is as long as the region it is sent from or received into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `src` to `to`.
    Send {
        /// Receiving rank.
        to: usize,
        /// Data sent.
        src: Region,
    },
    /// Receive from `from` into `dst`.
    Recv {
        /// Sending rank.
        from: usize,
        /// Where the data goes.
        dst: Region,
    },
    /// Receive from `from`, reduce with `src`, store in `dst` (may equal `src`).
    RecvReduce {
        /// Sending rank.
        from: usize,
        /// Local operand.
        src: Region,
        /// Result.
        dst: Region,
    },
    /// Receive from `from`, reduce with `src`, send the result to `to` without storing it.
    RecvReduceSend {
        /// Sending rank.
        from: usize,
        /// Receiving rank.
        to: usize,
        /// Local operand.
        src: Region,
    },
    /// Receive from `from`, reduce with `src`, store in `dst` and send to `to`.
    RecvReduceCopySend {
        /// Sending rank.
        from: usize,
        /// Receiving rank.
        to: usize,
        /// Local operand.
        src: Region,
        /// Result.
        dst: Region,
    },
    /// Receive from `from`, store in `dst` and pass it on to `to`.
    RecvCopySend {
        /// Sending rank.
        from: usize,
        /// Receiving rank.
        to: usize,
        /// Where the data goes.
        dst: Region,
    },
    /// Local copy (a no-op when `src` and `dst` are the same memory).
    Copy {
        /// From.
        src: Region,
        /// To.
        dst: Region,
    },
    /// Local reduction `dst = dst ⊕ src`.
    Reduce {
        /// Operand.
        src: Region,
        /// Operand and result.
        dst: Region,
    },
    /// Tells `to` that every earlier step of this channel has happened: an
    /// empty message, which orders those steps before whatever `to` does
    /// after its matching [`Wait`](Step::Wait).
    Notify {
        /// Receiving rank.
        to: usize,
    },
    /// Waits for `from`'s [`Notify`](Step::Notify).
    Wait {
        /// Sending rank.
        from: usize,
    },
}

impl Step {
    /// Elements this step moves or touches (its message length).
    pub fn len(&self) -> usize {
        match *self {
            Step::Send { src, .. } | Step::RecvReduceSend { src, .. } => src.len,
            Step::Recv { dst, .. } | Step::RecvCopySend { dst, .. } => dst.len,
            Step::RecvReduce { dst, .. } | Step::RecvReduceCopySend { dst, .. } => dst.len,
            Step::Copy { dst, .. } | Step::Reduce { dst, .. } => dst.len,
            Step::Notify { .. } | Step::Wait { .. } => 0,
        }
    }

    /// Whether the step does nothing (a notice, empty as it is, does something).
    pub fn is_empty(&self) -> bool {
        self.len() == 0 && !matches!(self, Step::Notify { .. } | Step::Wait { .. })
    }

    /// Whether this step, a copy, and `next`, a reduction into the same
    /// region from another, run as one pass (`dst = src ⊕ next's src`),
    /// as executors and the simulator run them: the copy's result is never
    /// written alone.
    pub fn fuses_with(&self, next: Option<&Step>) -> bool {
        matches!((self, next), (Step::Copy { src: a, dst: d }, Some(Step::Reduce { src: b, dst: e }))
            if d == e && a != d && b != d)
    }

    /// Whether the step is local: a copy or reduction of whole regions.
    pub fn is_local(&self) -> bool {
        matches!(self, Step::Copy { .. } | Step::Reduce { .. })
    }

    /// The rank this step receives from, if any.
    pub fn recv_peer(&self) -> Option<usize> {
        match *self {
            Step::Recv { from, .. }
            | Step::RecvReduce { from, .. }
            | Step::RecvReduceSend { from, .. }
            | Step::RecvReduceCopySend { from, .. }
            | Step::RecvCopySend { from, .. }
            | Step::Wait { from } => Some(from),
            _ => None,
        }
    }

    /// The rank this step sends to, if any.
    pub fn send_peer(&self) -> Option<usize> {
        match *self {
            Step::Send { to, .. }
            | Step::RecvReduceSend { to, .. }
            | Step::RecvReduceCopySend { to, .. }
            | Step::RecvCopySend { to, .. }
            | Step::Notify { to } => Some(to),
            _ => None,
        }
    }

    /// Regions read locally (not counting received data).
    pub fn reads(&self) -> Vec<Region> {
        match *self {
            Step::Send { src, .. } | Step::RecvReduceSend { src, .. } | Step::Copy { src, .. } => {
                vec![src]
            }
            Step::RecvReduce { src, .. } | Step::RecvReduceCopySend { src, .. } => vec![src],
            Step::Reduce { src, dst } => vec![src, dst],
            Step::Recv { .. } | Step::RecvCopySend { .. } | Step::Notify { .. } | Step::Wait { .. } => vec![],
        }
    }

    /// The region of the call's memory whose contents this step sends as
    /// they lie (a send, or what a fused step has just written and
    /// forwards), if any: what a connection could send straight from there.
    pub fn sends_as_is(&self) -> Option<Region> {
        match *self {
            Step::Send { src, .. } => Some(src),
            Step::RecvReduceCopySend { dst, .. } | Step::RecvCopySend { dst, .. } => Some(dst),
            _ => None,
        }
    }

    /// Regions written locally.
    pub fn writes(&self) -> Option<Region> {
        match *self {
            Step::Recv { dst, .. } | Step::RecvReduce { dst, .. } | Step::RecvReduceCopySend { dst, .. } => Some(dst),
            Step::RecvCopySend { dst, .. } | Step::Copy { dst, .. } | Step::Reduce { dst, .. } => Some(dst),
            Step::Send { .. } | Step::RecvReduceSend { .. } | Step::Notify { .. } | Step::Wait { .. } => None,
        }
    }
}

/// What one rank runs for one call: independent channels of ordered steps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Steps per channel; channels progress independently.
    pub channels: Vec<Vec<Step>>,
    /// Elements of scratch space the steps use.
    pub scratch: usize,
}

impl Schedule {
    /// Total steps over all channels.
    #[cfg(any(test, feature = "internals"))]
    pub fn steps(&self) -> usize {
        self.channels.iter().map(Vec::len).sum()
    }

    /// Drops steps of zero length. Matched sends and receives have equal
    /// lengths, so every rank drops both ends of an empty message alike.
    pub fn drop_empty(mut self) -> Self {
        for ch in &mut self.channels {
            ch.retain(|s| !s.is_empty());
        }
        self
    }
}

/// How a call's input and output map onto memory. When in place, both are
/// windows of one user buffer of `len` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Elements of the input buffer.
    pub input: usize,
    /// Elements of the output buffer.
    pub output: usize,
    /// `Some` when input and output share one buffer.
    pub in_place: Option<InPlace>,
}

/// Where input and output sit inside the one buffer of an in-place call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InPlace {
    /// Elements of the shared buffer.
    pub len: usize,
    /// Offset of the input window.
    pub input_off: usize,
    /// Offset of the output window.
    pub output_off: usize,
}

impl Layout {
    /// Maps a region onto (buffer, offset) in memory: in place, input and
    /// output regions both land in `Buf::Output`, the shared buffer. Peers'
    /// regions are resolved already.
    #[inline]
    pub fn resolve(&self, r: Region) -> Region {
        match (self.in_place, r.buf) {
            (Some(ip), Buf::Input) => Region::new(Buf::Output, r.off + ip.input_off, r.len),
            (Some(ip), Buf::Output) => Region::new(Buf::Output, r.off + ip.output_off, r.len),
            _ => r,
        }
    }

    /// Length of a resolved buffer. A peer's buffers are taken to be as
    /// long as this rank's (they are where schedules reach them: every
    /// rank's buffers of the calls they run on have one shape), and it has
    /// no send buffer of its own in place.
    #[inline]
    pub fn capacity(&self, buf: Buf, scratch: usize) -> usize {
        match (self.in_place, buf) {
            (_, Buf::Scratch) => scratch,
            (Some(_), Buf::PeerInput(_)) => 0,
            (None, Buf::PeerInput(_)) => self.input,
            (_, Buf::PeerOutput(_)) => self.capacity(Buf::Output, scratch),
            (Some(ip), _) => ip.len,
            (None, Buf::Input) => self.input,
            (None, Buf::Output) => self.output,
        }
    }
}
