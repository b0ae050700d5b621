//! [`Graph`]: work captured from a stream, ccl's collectives included,
//! replayed as a whole.

use super::{Device, Stream};
use crate::error::Result;
use std::sync::Arc;

/// Work captured from a [`Stream`] between [`Stream::begin_capture`] and
/// [`Stream::end_capture`] (a CUDA graph, instantiated), launched again
/// and again with [`launch`](Self::launch).
///
/// A collective queued while its stream is captured is recorded, not
/// run: each launch runs it anew on whatever the buffers then hold, the
/// same on every rank, as long as every rank launches its graphs and
/// makes its other calls on the communicator in the same order (as with
/// NCCL). What a capture cannot record is an error naming it: a
/// connection staged through the host (tcp), whose bytes need the host at
/// each run. The hosts check that the calls match once, when captured;
/// a launch is not watched for lost peers (see [`Stream::synchronize`]).
#[derive(Debug)]
pub struct Graph {
    dev: Arc<dyn Device>,
    raw: u64,
}

impl Graph {
    /// Queues a run of the graph on `stream` (of the same GPU), after the
    /// work already queued there; returns without waiting for it.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.dev.launch_graph(self.raw, stream.raw())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        self.dev.drop_graph(self.raw);
    }
}

impl Stream {
    /// Starts capturing the work queued on this stream (and on streams
    /// that join it, as ccl's channel streams do) into a graph, instead of
    /// running it (`cuStreamBeginCapture`, relaxed mode).
    pub fn begin_capture(&self) -> Result<()> {
        self.dev().begin_capture(self.raw())
    }

    /// Ends the capture begun on this stream: the graph, ready to launch.
    pub fn end_capture(&self) -> Result<Graph> {
        let raw = self.dev().end_capture(self.raw())?;
        Ok(Graph { dev: Arc::clone(self.dev()), raw })
    }
}
