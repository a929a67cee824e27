//! The handler's doorbell: an eventfd that the fetch and write-back threads
//! ring when they finish a job, and that the handler polls beside the
//! userfaultfd. Without it the handler would notice a finished window only
//! when the next fault came or its 1 ms poll timed out, and a sequential
//! scan, whose program touches mapped pages with no fault for a whole
//! window, would wait up to a millisecond for windows already read.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

pub(crate) struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    pub(crate) fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd takes its arguments by value and returns a new fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nothing else owns.
        Ok(Doorbell { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Wake the handler. Never blocks: the counter only saturates after
    /// 2^64 - 2 rings without a `clear`, and then a ring is dropped, which
    /// costs at most the handler's poll timeout.
    pub(crate) fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer to our own fd.
        unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Reset after the handler woke; the rings so far are answered by the
    /// look at every thread's results that follows.
    pub(crate) fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer; the fd is
        // non-blocking, so an unrung bell returns EAGAIN at once.
        unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
