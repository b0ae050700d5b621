//! The exit status of a rank process whose communicator found a problem
//! only as it was dropped, when no call was left to return it: the process
//! still ends as it would (destructors, buffered output), then exits with
//! that status instead of its own, so that its launcher fails the job.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The status to exit with, 0 for none.
static STATUS: AtomicI32 = AtomicI32::new(0);

/// Whether [`at_exit`] is registered (processes of `ccl::init`; ranks as
/// threads only say what they found).
static HOOKED: AtomicBool = AtomicBool::new(false);

/// Registers the exit hook, once per process.
pub(crate) fn hook() {
    if !HOOKED.swap(true, Ordering::SeqCst) {
        // SAFETY: registers a function with C linkage and no arguments that
        // stays valid for the life of the process.
        unsafe { libc::atexit(at_exit) };
    }
}

/// Makes the process exit with `status` when it ends (if hooked).
pub(crate) fn fail_at_exit(status: i32) {
    let _ = STATUS.compare_exchange(0, status, Ordering::SeqCst, Ordering::SeqCst);
}

extern "C" fn at_exit() {
    let status = STATUS.load(Ordering::SeqCst);
    if status != 0 {
        // SAFETY: flushing every C stream, then ending the process, are
        // what exit() itself would do next; Rust's own output was flushed
        // before exit() ran the hooks.
        unsafe {
            libc::fflush(std::ptr::null_mut());
            libc::_exit(status)
        }
    }
}
