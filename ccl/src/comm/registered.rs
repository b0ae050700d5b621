//! What makes a [`RegisteredBuffer`] (host memory registered by
//! [`Communicator::register`](super::Communicator::register)) a buffer the
//! collectives take.

use super::buffer::{sealed, Buffer, BufferMut, Place};
pub use crate::transport::RegisteredBuffer;
use std::ops::{Deref, DerefMut};

impl<T> Deref for RegisteredBuffer<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.buf
    }
}

impl<T> DerefMut for RegisteredBuffer<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.buf
    }
}

impl<T> std::fmt::Debug for RegisteredBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("len", &self.buf.len())
            .field("registered", &self.is_registered())
            .finish()
    }
}

impl<T> sealed::Sealed for RegisteredBuffer<'_, T> {}

impl<T> Buffer<T> for RegisteredBuffer<'_, T> {
    fn elems(&self) -> usize {
        self.buf.len()
    }
    fn place(&self) -> Place {
        Place::Host(self.buf.as_ptr() as *const u8)
    }
}

impl<T> BufferMut<T> for RegisteredBuffer<'_, T> {
    fn place_mut(&mut self) -> Place {
        Place::Host(self.buf.as_mut_ptr() as *const u8)
    }
}
