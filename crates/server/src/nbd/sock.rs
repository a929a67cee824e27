//! The socket calls std lacks: a receive that never blocks (to spin briefly
//! before sleeping) and one that waits for a whole payload.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Receive into `buf` without blocking: `Ok(None)` if nothing is there yet,
/// `Ok(Some(0))` at end of stream.
pub(crate) fn recv_nowait(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is writable memory of `buf.len()` bytes for the whole
    // call, and the descriptor belongs to `stream`, which outlives the call.
    let n = unsafe {
        libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
    };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

/// Block until `buf` is full, the stream ends or a signal arrives
/// (`MSG_WAITALL`): one call for the rest of a large payload, instead of one
/// per piece as it arrives.
pub(crate) fn recv_waitall(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: as in `recv_nowait`.
        let n = unsafe {
            libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_WAITALL)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
