//! The socket calls std lacks: a receive that never blocks (to spin briefly
//! before sleeping) and one that waits for a whole payload.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Receive into `buf` without blocking: `Ok(None)` if nothing is there yet,
/// `Ok(Some(0))` at end of stream.
pub fn recv_nowait(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
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
pub fn recv_waitall(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
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

/// Poll `stream` for input into `buf` for up to `spin`, yielding the CPU
/// between polls; `Ok(None)` if nothing came. A busy client's next request
/// usually arrives within the spin and is then picked up without the ~10 µs
/// cross-core wakeup of a thread sleeping in `read`. The yield lets a client
/// (or anything else) sharing this core run: on two cores a plain spin loses
/// more than it gains once there are two clients.
pub fn recv_spinning(
    stream: &TcpStream,
    buf: &mut [u8],
    spin: std::time::Duration,
) -> io::Result<Option<usize>> {
    if spin.is_zero() {
        return Ok(None);
    }
    let deadline = std::time::Instant::now() + spin;
    // Bounded by the deadline; each pass is one non-blocking recv.
    while std::time::Instant::now() < deadline {
        if let Some(n) = recv_nowait(stream, buf)? {
            return Ok(Some(n));
        }
        std::thread::yield_now();
    }
    Ok(None)
}
