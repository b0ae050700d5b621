//! Where a call's buffers live, and the GPU a communicator's device calls
//! are bound to: the checks a device call passes before it is planned.

use super::Stream;
use crate::error::{Error, Result};
use std::sync::Mutex;

/// Where a buffer's elements are, for the call that receives it.
#[doc(hidden)]
pub enum Place {
    /// Host memory at this address.
    Host(*const u8),
    /// Device memory: the buffer, checked and ordered on its stream.
    Device {
        /// The device address.
        ptr: u64,
        /// Its stream (and through it, its GPU).
        stream: Stream,
        /// Whether the address really is device memory of that GPU.
        check: crate::Result<()>,
    },
}

/// The GPU (context) of a communicator's first device call, with its
/// name; later calls must use the same.
#[derive(Default)]
pub(crate) struct GpuBinding(Mutex<Option<(u64, String)>>);

impl GpuBinding {
    /// The addresses of a call's buffers and, for device buffers, the
    /// stream it is ordered on; errors for host and device memory mixed,
    /// memory of another GPU or context than the stream's, or a GPU other
    /// than this communicator's first device call used.
    pub(crate) fn resolve(
        &self,
        input: Option<Place>,
        output: Option<Place>,
    ) -> Result<(usize, usize, Option<Stream>)> {
        let dangling = std::ptr::NonNull::<u64>::dangling().as_ptr() as usize;
        // host memory, the common case: nothing to check
        let host = |p: &Option<Place>| match p {
            Some(Place::Host(ptr)) => Some(*ptr as usize),
            None => Some(dangling),
            Some(Place::Device { .. }) => None,
        };
        if let (Some(i), Some(o)) = (host(&input), host(&output)) {
            return Ok((i, o, None));
        }
        let kind = |p: &Option<Place>| match p {
            Some(Place::Host(_)) => "host memory",
            Some(Place::Device { .. }) => "device memory",
            None => "absent",
        };
        let (ki, ko) = (kind(&input), kind(&output));
        if ki != ko && ki != "absent" && ko != "absent" {
            return Err(Error::invalid(format!(
                "the input buffer is {ki} but the output buffer is {ko}: pass both on the GPU or both on the host"
            )));
        }
        let mut stream: Option<Stream> = None;
        let mut addr = |p: Option<Place>| -> Result<usize> {
            match p {
                None => Ok(dangling),
                Some(Place::Host(ptr)) => Ok(ptr as usize),
                Some(Place::Device { ptr, stream: s, check }) => {
                    check?;
                    if let Some(first) = &stream {
                        if first.dev().context() != s.dev().context() {
                            return Err(Error::device(format!(
                                "the input buffer is on {} but the output buffer is on {}",
                                s.dev().describe(),
                                first.dev().describe()
                            )));
                        }
                    } else {
                        stream = Some(s);
                    }
                    Ok(ptr as usize)
                }
            }
        };
        // the output's stream orders the call: resolve it first
        let o = addr(output)?;
        let i = addr(input)?;
        if let Some(s) = &stream {
            let dev = s.dev();
            let ctx = dev.stream_context(s.raw())?;
            if ctx != dev.context() {
                return Err(Error::device(format!("the stream belongs to another context than {}", dev.describe())));
            }
            let mut bound = self.0.lock().map_err(|_| Error::internal("gpu lock poisoned"))?;
            match &*bound {
                Some((c, name)) if *c != ctx => {
                    return Err(Error::device(format!(
                        "this communicator runs on {name}; a buffer on {} cannot join it (one GPU per rank and communicator)",
                        dev.describe()
                    )))
                }
                Some(_) => {}
                None => *bound = Some((ctx, dev.describe())),
            }
        }
        Ok((i, o, stream))
    }
}
