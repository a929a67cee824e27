//! The socket calls std lacks: a receive that never blocks (to spin briefly
//! before sleeping) and one that waits for a whole payload.

mod nice;
mod spin;
mod wake;
pub use nice::{SpinNice, SPIN_NICE};
pub use spin::AdaptiveSpin;
pub use wake::{spin_pays, wake_cost, SpinSetting, SPIN_US_MAX, WAKE_DEAR};

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};

/// Someone listens at `addr`. A bare connect is not proof: to a loopback
/// port no one listens on, it meets itself when the kernel picks that very
/// port as its source (TCP simultaneous open; a port taken from a bind to
/// port 0 is an ephemeral one). A test that took that for its daemon sent
/// SIGTERM before the daemon had started (CI, once).
pub fn someone_listens(addr: std::net::SocketAddr) -> bool {
    TcpStream::connect(addr).is_ok_and(|s| s.local_addr().ok() != Some(addr))
}

/// Receive into `buf` without blocking: `Ok(None)` if nothing is there yet,
/// `Ok(Some(0))` at end of stream.
pub fn recv_nowait(stream: &impl AsFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is writable memory of `buf.len()` bytes for the whole
    // call, and the descriptor belongs to `stream`, which outlives the call.
    let n = unsafe {
        libc::recv(
            stream.as_fd().as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
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
pub fn recv_waitall(stream: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: as in `recv_nowait`.
        let n = unsafe {
            libc::recv(
                stream.as_fd().as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_WAITALL,
            )
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
    stream: &impl AsFd,
    buf: &mut [u8],
    spin: std::time::Duration,
) -> io::Result<Option<usize>> {
    spin_for(spin, || recv_nowait(stream, buf))
}

/// Call `poll` (a receive that never blocks) until it gives something or
/// `spin` has passed, yielding the CPU between calls; see `recv_spinning`.
pub fn spin_for(
    spin: std::time::Duration,
    mut poll: impl FnMut() -> io::Result<Option<usize>>,
) -> io::Result<Option<usize>> {
    if spin.is_zero() {
        return Ok(None);
    }
    let deadline = std::time::Instant::now() + spin;
    // Bounded by the deadline; each pass is one poll.
    while std::time::Instant::now() < deadline {
        if let Some(n) = poll()? {
            return Ok(Some(n));
        }
        std::thread::yield_now();
    }
    Ok(None)
}

/// How long a silent peer may go unnoticed: TCP keepalive probes after
/// `idle`, every `interval`, `count` times; and unacknowledged data older
/// than `user_timeout` breaks the connection. Without this a borrower whose
/// network vanished would hold its connection slot and its slabs forever.
pub struct Liveness {
    pub idle: std::time::Duration,
    pub interval: std::time::Duration,
    pub count: u32,
    pub user_timeout: std::time::Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        let s = std::time::Duration::from_secs;
        Liveness { idle: s(10), interval: s(5), count: 3, user_timeout: s(30) }
    }
}

/// Apply `l` to `stream`.
pub fn set_liveness(stream: &TcpStream, l: &Liveness) -> io::Result<()> {
    let secs = |d: std::time::Duration| d.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    let ms = l.user_timeout.as_millis().min(u32::MAX as u128) as libc::c_int;
    setsockopt(stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    setsockopt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(l.idle))?;
    setsockopt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(l.interval))?;
    setsockopt(stream, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, l.count as libc::c_int)?;
    setsockopt(stream, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)
}

fn setsockopt(
    stream: &TcpStream,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size; the descriptor
    // belongs to `stream`, which outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn liveness_applies_and_spinning_sees_data_and_end_of_stream() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        set_liveness(&a, &Liveness::default()).unwrap();
        let mut buf = [0u8; 8];
        let spin = std::time::Duration::from_micros(200);
        assert_eq!(recv_spinning(&b, &mut buf, spin).unwrap(), None, "nothing sent yet");
        std::io::Write::write_all(&mut &a, b"hi").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let got = loop {
            if let Some(n) = recv_spinning(&b, &mut buf, spin).unwrap() {
                break n;
            }
            assert!(std::time::Instant::now() < deadline);
        };
        assert_eq!(&buf[..got], b"hi");
        drop(a);
        let end = loop {
            if let Some(n) = recv_spinning(&b, &mut buf, spin).unwrap() {
                break n;
            }
            assert!(std::time::Instant::now() < deadline);
        };
        assert_eq!(end, 0, "end of stream");
    }
}
