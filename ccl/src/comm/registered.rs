//! [`RegisteredBuffer`]: host memory registered with a group's RDMA
//! devices for as long as it is borrowed (NCCL's `ncclCommRegister`).

use super::buffer::{sealed, Buffer, BufferMut, Place};
use crate::transport::Registered;
use std::ops::{Deref, DerefMut};

/// A slice registered with the RDMA devices of the group that made it
/// ([`Communicator::register`](super::Communicator::register)): messages
/// that blocking calls on it send over RDMA are written straight from it,
/// not copied into the connection's slots first. Dereferences to the
/// slice. The registration ends when it drops; without RDMA there is none,
/// and it is the slice as it is.
pub struct RegisteredBuffer<'a, T> {
    reg: Registered<'a, T>,
}

impl<'a, T> RegisteredBuffer<'a, T> {
    pub(super) fn new(reg: Registered<'a, T>) -> Self {
        RegisteredBuffer { reg }
    }

    /// Whether any device registered it (none: no RDMA in the group).
    pub fn is_registered(&self) -> bool {
        self.reg.count() > 0
    }
}

impl<T> Deref for RegisteredBuffer<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.reg.buf
    }
}

impl<T> DerefMut for RegisteredBuffer<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.reg.buf
    }
}

impl<T> std::fmt::Debug for RegisteredBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("len", &self.reg.buf.len())
            .field("registrations", &self.reg.count())
            .finish()
    }
}

impl<T> sealed::Sealed for RegisteredBuffer<'_, T> {}

impl<T> Buffer<T> for RegisteredBuffer<'_, T> {
    fn elems(&self) -> usize {
        self.reg.buf.len()
    }
    fn place(&self) -> Place {
        Place::Host(self.reg.buf.as_ptr() as *const u8)
    }
}

impl<T> BufferMut<T> for RegisteredBuffer<'_, T> {
    fn place_mut(&mut self) -> Place {
        Place::Host(self.reg.buf.as_mut_ptr() as *const u8)
    }
}
