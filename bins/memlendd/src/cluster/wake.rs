//! Wake the control loop from another thread: a byte on a socket pair that
//! the loop polls beside its UDP socket.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

#[derive(Clone)]
pub struct Waker(Arc<UnixDatagram>);

pub struct WakeRx(UnixDatagram);

pub fn pair() -> std::io::Result<(Waker, WakeRx)> {
    let (tx, rx) = UnixDatagram::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    Ok((Waker(Arc::new(tx)), WakeRx(rx)))
}

impl Waker {
    pub fn wake(&self) {
        // Full means a wakeup is already pending: nothing lost.
        let _ = self.0.send(&[1]);
    }
}

impl WakeRx {
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        while self.0.recv(&mut buf).is_ok() {}
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Wait until one of `fds` is readable or `timeout_ms` passes.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `p` is a valid array of `p.len()` pollfd structs that lives
    // across the call; poll only writes their `revents` fields.
    let _ = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
}
