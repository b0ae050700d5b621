//! The verbs every connection offers, and what a connection can do beyond
//! them ([`Offers`]).
//!
//! A transport's sending and receiving ends implement [`SendVerbs`] and
//! [`RecvVerbs`]; the executor calls only these and asks only what a
//! connection [`Offers`], never which transport it belongs to. The
//! registry ([`links!`](super::links)) wraps the ends of every transport
//! in one enum per direction, dispatched by `match` on the data path.

use super::fifo;
use crate::error::{Error, Result};

/// What a connection offers beyond moving slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offers {
    /// The sender can send straight from the caller's memory
    /// ([`SendVerbs::lend`]): where a slot would only add a copy.
    pub lends: bool,
    /// The receiver can read a message straight into the call's memory
    /// ([`RecvVerbs::post_into`]).
    pub lands: bool,
    /// Readiness is learned by a system call on a file descriptor (a
    /// socket, a completion channel), not by a look at memory: polling it
    /// is dear.
    pub pollable: bool,
    /// Slots are staged in this process and pushed on by
    /// [`SendVerbs::flush`]; a device call stages through host memory
    /// ([`SendVerbs::staging_memory`]).
    pub staged: bool,
    /// The receiver reads the slots from another process's mapping, so
    /// memory it may still be reading cannot be kept alive by
    /// [`SendVerbs::attach`].
    pub read_elsewhere: bool,
}

/// The sending end of a connection.
pub trait SendVerbs {
    /// What this end offers.
    fn offers(&self) -> Offers;
    /// Bytes per slot.
    fn slot_bytes(&self) -> usize;
    /// Room in a free slot for a message of `bytes` bytes (at most a
    /// slot), placed to `spread` where the transport can
    /// ([`FifoSend::reserve`](fifo::FifoSend::reserve)), if any (`None`
    /// also while still connecting).
    fn reserve(&mut self, bytes: usize, spread: bool) -> Result<Option<*mut u8>>;
    /// Publishes the slot [`reserve`](Self::reserve) returned, holding
    /// `bytes` bytes of the call whose fingerprint is `fp`.
    fn post(&mut self, bytes: usize, fp: &[u64; 4]);
    /// Pushes staged data on ([`Offers::staged`]).
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
    /// Tells the receiver, as this end's last message, that endpoint
    /// `lost` is gone, where the transport has no other way to.
    fn announce_lost(&mut self, _lost: usize) {}
    /// Sends `bytes` bytes at `p` as the next message without copying them
    /// into a slot. The slot [`reserve`](Self::reserve) returned goes back,
    /// or with `hold` stays held for the message until it is sent, so that
    /// [`reclaim`](Self::reclaim) can take the message back into it. An
    /// error, sending nothing, where this end does not [`lend`](Offers::lends).
    ///
    /// # Safety
    ///
    /// `p` must stay valid for reads of `bytes` bytes, unchanged, until
    /// [`lent`](Self::lent) is 0, [`forget_lent`](Self::forget_lent) has
    /// run, or (with `hold`, for the bytes it covers) [`reclaim`](Self::reclaim).
    unsafe fn lend(&mut self, _p: *const u8, _bytes: usize, _fp: &[u64; 4], _hold: bool) -> Result<()> {
        Err(Error::internal("a connection that sends only from its slots was lent a message"))
    }
    /// Messages of lent memory not yet fully sent.
    fn lent(&self) -> usize {
        0
    }
    /// Takes back held lent messages not yet sent that overlap the `bytes`
    /// bytes at `p` (copying them into their slots), so that the lender may
    /// overwrite those bytes.
    fn reclaim(&mut self, _p: *const u8, _bytes: usize) {}
    /// Drops lent messages not yet sent (their memory is about to go: the
    /// call failed); a message cut short breaks this end.
    fn forget_lent(&mut self) {}
    /// The staging memory of a staged end (to page-lock for a GPU): it
    /// lives as long as this end.
    fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        None
    }
    /// Keeps `a` alive until the receiver has dropped its end too; `false`
    /// where the receiver is in another process (nothing to keep alive for).
    fn attach(&mut self, _a: fifo::Attachment) -> bool {
        false
    }
}

/// The receiving end of a connection.
pub trait RecvVerbs {
    /// What this end offers.
    fn offers(&self) -> Offers;
    /// Bytes per slot.
    fn slot_bytes(&self) -> usize;
    /// The oldest arrived slot, its length in bytes and the sender's call
    /// fingerprint, if any.
    fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>>;
    /// Returns the slot [`peek`](Self::peek) returned to the sender.
    fn release(&mut self);
    /// Gives the message `ahead` after the next one [`peek`](Self::peek)
    /// will return a place of `cap` bytes at `p` to be read into instead
    /// of a slot, where it has not started to arrive; `peek` then returns
    /// `p`. Nothing where this end does not [`land`](Offers::lands).
    ///
    /// # Safety
    ///
    /// `p` must be valid for writes of `cap` bytes, and nothing else may
    /// read or write them, until that message has been released or
    /// [`withdraw`](Self::withdraw) has run.
    unsafe fn post_into(&mut self, _ahead: usize, _p: *mut u8, _cap: usize) {}
    /// Takes back every place given by [`post_into`](Self::post_into)
    /// (their memory is about to go: the call failed); what was read into
    /// them moves into slots.
    fn withdraw(&mut self) {}
    /// The staging memory of a staged end (to page-lock for a GPU).
    fn staging_memory(&self) -> Option<(*mut u8, usize)> {
        None
    }
    /// What the sender attached (a FIFO in this process's memory).
    fn attached(&self) -> Option<fifo::Attachment> {
        None
    }
}

/// The registry of connection kinds: one line per transport, naming its
/// sending and receiving ends. Generates [`SendConn`](super::SendConn) and
/// [`RecvConn`](super::RecvConn), which implement the verbs by `match`
/// (static dispatch on the data path), and `From` each end.
macro_rules! links {
    ($($(#[$m:meta])* $name:ident($send:ty, $recv:ty)),+ $(,)?) => {
        /// The sending end of a connection, of whichever transport.
        pub enum SendConn { $($(#[$m])* #[doc = stringify!($send)] $name($send)),+ }
        /// The receiving end of a connection, of whichever transport.
        pub enum RecvConn { $($(#[$m])* #[doc = stringify!($recv)] $name($recv)),+ }
        $($(#[$m])* impl From<$send> for SendConn {
            fn from(c: $send) -> Self { SendConn::$name(c) }
        }
        $(#[$m])* impl From<$recv> for RecvConn {
            fn from(c: $recv) -> Self { RecvConn::$name(c) }
        })+
        links!(@each SendConn [$($(#[$m])* $name)+] SendVerbs {
            fn offers(&self) -> Offers;
            fn slot_bytes(&self) -> usize;
            fn reserve(&mut self, bytes: usize, spread: bool) -> Result<Option<*mut u8>>;
            fn post(&mut self, bytes: usize, fp: &[u64; 4]) -> ();
            fn flush(&mut self) -> Result<()>;
            fn announce_lost(&mut self, lost: usize) -> ();
            unsafe fn lend(&mut self, p: *const u8, bytes: usize, fp: &[u64; 4], hold: bool) -> Result<()>;
            fn lent(&self) -> usize;
            fn reclaim(&mut self, p: *const u8, bytes: usize) -> ();
            fn forget_lent(&mut self) -> ();
            fn staging_memory(&self) -> Option<(*mut u8, usize)>;
            fn attach(&mut self, a: fifo::Attachment) -> bool;
        });
        links!(@each RecvConn [$($(#[$m])* $name)+] RecvVerbs {
            fn offers(&self) -> Offers;
            fn slot_bytes(&self) -> usize;
            fn peek(&mut self) -> Result<Option<(*const u8, usize, [u64; 4])>>;
            fn release(&mut self) -> ();
            unsafe fn post_into(&mut self, ahead: usize, p: *mut u8, cap: usize) -> ();
            fn withdraw(&mut self) -> ();
            fn staging_memory(&self) -> Option<(*mut u8, usize)>;
            fn attached(&self) -> Option<fifo::Attachment>;
        });
    };
    (@each $enum:ident $names:tt $tr:ident { $($body:tt)* }) => {
        impl $tr for $enum { links!(@fns $tr $enum $names $($body)*); }
    };
    (@fns $tr:ident $enum:ident $names:tt) => {};
    (@match $tr:ident $enum:ident $me:ident $f:ident $c:ident $args:tt [$($(#[$m:meta])* $name:ident)+]) => {
        match $me { $($(#[$m])* $enum::$name($c) => $tr::$f $args),+ }
    };
    (@fns $tr:ident $enum:ident [$($(#[$m:meta])* $name:ident)+]
        fn $f:ident(&self $(, $a:ident: $t:ty)*) -> $r:ty; $($rest:tt)*) => {
        #[inline]
        fn $f(&self $(, $a: $t)*) -> $r {
            links!(@match $tr $enum self $f c (c $(, $a)*) [$($(#[$m])* $name)+])
        }
        links!(@fns $tr $enum [$($(#[$m])* $name)+] $($rest)*);
    };
    (@fns $tr:ident $enum:ident [$($(#[$m:meta])* $name:ident)+]
        fn $f:ident(&mut self $(, $a:ident: $t:ty)*) -> $r:ty; $($rest:tt)*) => {
        #[inline]
        fn $f(&mut self $(, $a: $t)*) -> $r {
            links!(@match $tr $enum self $f c (c $(, $a)*) [$($(#[$m])* $name)+])
        }
        links!(@fns $tr $enum [$($(#[$m])* $name)+] $($rest)*);
    };
    (@fns $tr:ident $enum:ident [$($(#[$m:meta])* $name:ident)+]
        unsafe fn $f:ident(&mut self $(, $a:ident: $t:ty)*) -> $r:ty; $($rest:tt)*) => {
        #[inline]
        unsafe fn $f(&mut self $(, $a: $t)*) -> $r {
            // SAFETY: the caller's contract is the trait method's, passed on.
            unsafe { links!(@match $tr $enum self $f c (c $(, $a)*) [$($(#[$m])* $name)+]) }
        }
        links!(@fns $tr $enum [$($(#[$m])* $name)+] $($rest)*);
    };
}
pub(crate) use links;
