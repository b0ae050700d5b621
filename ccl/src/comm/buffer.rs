//! What the blocking collectives accept as buffers: host memory (`[T]`,
//! `Vec<T>`, `[T; N]`, [`SharedBuffer<T>`]) or device memory ([`DeviceBuffer<T>`]).

use super::shared::{SharedBuffer, Window};
use crate::gpu::DeviceBuffer;
pub use crate::gpu::Place;
use crate::Reduce;

pub(super) mod sealed {
    pub trait Sealed {}
}

/// A buffer a collective reads: `[T]`, `Vec<T>`, `[T; N]` or a
/// [`DeviceBuffer<T>`].
pub trait Buffer<T>: sealed::Sealed {
    /// Elements.
    fn elems(&self) -> usize;
    #[doc(hidden)]
    fn place(&self) -> Place;
    /// The shared memory the buffer lives in, for a [`SharedBuffer`].
    #[doc(hidden)]
    fn window(&self) -> Option<&Window> {
        None
    }
}

/// A buffer a collective writes.
pub trait BufferMut<T>: Buffer<T> {
    #[doc(hidden)]
    fn place_mut(&mut self) -> Place;
}

macro_rules! host_buffer {
    ($([$($g:tt)*] $t:ty),*) => {$(
        impl<$($g)*> sealed::Sealed for $t {}
        impl<$($g)*> Buffer<T> for $t {
            fn elems(&self) -> usize {
                self.len()
            }
            fn place(&self) -> Place {
                Place::Host(self.as_ptr() as *const u8)
            }
        }
        impl<$($g)*> BufferMut<T> for $t {
            fn place_mut(&mut self) -> Place {
                Place::Host(self.as_mut_ptr() as *const u8)
            }
        }
    )*};
}

host_buffer!([T] [T], [T] Vec<T>, [T, const N: usize] [T; N]);

impl<T: Reduce> sealed::Sealed for DeviceBuffer<T> {}

impl<T: Reduce> Buffer<T> for DeviceBuffer<T> {
    fn elems(&self) -> usize {
        self.len()
    }
    fn place(&self) -> Place {
        Place::Device { ptr: self.device_ptr(), stream: self.stream().clone(), check: self.check_memory("the buffer") }
    }
}

impl<T: Reduce> BufferMut<T> for DeviceBuffer<T> {
    fn place_mut(&mut self) -> Place {
        self.place()
    }
}

impl<T: Reduce> sealed::Sealed for SharedBuffer<T> {}

impl<T: Reduce> Buffer<T> for SharedBuffer<T> {
    fn elems(&self) -> usize {
        self.len()
    }
    fn place(&self) -> Place {
        Place::Host(self.as_ptr() as *const u8)
    }
    fn window(&self) -> Option<&Window> {
        Some(SharedBuffer::window(self))
    }
}

impl<T: Reduce> BufferMut<T> for SharedBuffer<T> {
    fn place_mut(&mut self) -> Place {
        Place::Host(self.as_mut_ptr() as *const u8)
    }
}
