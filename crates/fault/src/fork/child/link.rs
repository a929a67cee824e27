//! The socket between a forked child's handler and its parent: the child
//! asks for pages, the parent answers with their bytes as at the fork.
//!
//! Request: a u32 count (1..=`LINK_PAGES_MAX`), then that many u32 page
//! numbers, little-endian. Answer: a status byte (0: the pages follow,
//! each 4 KiB, in order; 1: the parent could not read them, nothing
//! follows). A request that breaks these rules ends the link.

use super::source::{ChildSource, LINK_PAGES_MAX};
use memlend_store::PAGE_SIZE;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// How long each end polls, yielding, before it sleeps: the child for an
/// answer (the parent's store read is in it), the parent for the next
/// request. A `BGSAVE` child faults every few microseconds, and waking a
/// sleeping thread across cores costs 15-50 us on these VMs: with both
/// ends asleep a page took ~100 us (`forklazy_*.json`).
const ANSWER_SPIN: Duration = Duration::from_micros(200);
const REQUEST_SPIN: Duration = Duration::from_micros(100);
const OK: u8 = 0;
const FAILED: u8 = 1;

/// The child's end.
pub struct LinkSource {
    stream: UnixStream,
}

impl LinkSource {
    pub fn new(stream: UnixStream) -> LinkSource {
        LinkSource { stream }
    }
}

impl ChildSource for LinkSource {
    fn read(&mut self, pages: &[u32], out: &mut [u8]) -> io::Result<()> {
        assert!(pages.len() <= LINK_PAGES_MAX && out.len() == pages.len() * PAGE_SIZE);
        let mut request = Vec::with_capacity(4 * (1 + pages.len()));
        request.extend_from_slice(&(pages.len() as u32).to_le_bytes());
        pages.iter().for_each(|p| request.extend_from_slice(&p.to_le_bytes()));
        send_all(&self.stream, &request)?;
        let mut status = [0u8];
        read_spinning(&mut self.stream, &mut status, ANSWER_SPIN)?;
        if status[0] != OK {
            return Err(io::Error::other("the parent could not read these pages"));
        }
        self.stream.read_exact(out)
    }
}

/// The parent's end: answer requests with `read` (one page into a 4 KiB
/// buffer) until the child closes its end (it exited or exec'd). Each
/// answer's pages are added to `sent` as they go (a child killed part-way
/// still shows what it read); returns how many this link sent.
pub fn serve_link(
    mut stream: UnixStream,
    mut read: impl FnMut(u32, &mut [u8]) -> io::Result<()>,
    sent_total: &std::sync::atomic::AtomicU64,
) -> io::Result<u64> {
    let mut sent = 0u64;
    let mut buf = vec![0u8; LINK_PAGES_MAX * PAGE_SIZE];
    loop {
        let mut count = [0u8; 4];
        match read_spinning(&mut stream, &mut count, REQUEST_SPIN) {
            Ok(()) => {}
            Err(e) if child_gone(&e) => return Ok(sent),
            Err(e) => return Err(e),
        }
        let n = u32::from_le_bytes(count) as usize;
        if n == 0 || n > LINK_PAGES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("asked for {n} pages")));
        }
        let mut pages = [0u8; 4 * LINK_PAGES_MAX];
        match stream.read_exact(&mut pages[..4 * n]) {
            Ok(()) => {}
            Err(e) if child_gone(&e) => return Ok(sent),
            Err(e) => return Err(e),
        }
        let pages =
            pages[..4 * n].chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut failed = None;
        for (i, page) in pages.enumerate() {
            if let Err(e) = read(page, &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]) {
                failed = Some(e);
                break;
            }
        }
        let answered = match &failed {
            None => {
                send_all(&stream, &[OK]).and_then(|()| send_all(&stream, &buf[..n * PAGE_SIZE]))
            }
            Some(e) => {
                tracing::error!("a forked child's far pages: {e}");
                send_all(&stream, &[FAILED])
            }
        };
        match answered {
            Ok(()) if failed.is_none() => {
                sent += n as u64;
                sent_total.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(()) => {}
            Err(e) if child_gone(&e) => return Ok(sent),
            Err(e) => return Err(e),
        }
    }
}

/// `read_exact`, polling for the first bytes for up to `spin` before a
/// sleeping read.
fn read_spinning(stream: &mut UnixStream, buf: &mut [u8], spin: Duration) -> io::Result<()> {
    let got = match memlend_net::recv_spinning(&*stream, buf, spin)? {
        Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
        Some(n) => n,
        None => 0,
    };
    stream.read_exact(&mut buf[got..])
}

/// The child's end closed: it exited, exec'd or was killed, maybe in the
/// middle of a request. Not an error: that is how every link ends.
fn child_gone(e: &io::Error) -> bool {
    use io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    matches!(e.kind(), UnexpectedEof | ConnectionReset | BrokenPipe)
}

/// write_all with MSG_NOSIGNAL: a write to a closed end must be an error
/// (EPIPE), never a SIGPIPE, which would end a program that does not
/// ignore it (the parent, when a child dies with a request in flight).
fn send_all(stream: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    // Bounded: each turn sends at least a byte or fails (EINTR retried).
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for `buf.len()` bytes; the descriptor is
        // the stream's own, open while `stream` lives.
        let sent = unsafe {
            libc::send(stream.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL)
        };
        if sent < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[sent as usize..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::atomic::AtomicU64;

    /// A child that asks and dies before reading the answer ends the link
    /// quietly: the parent's send fails (EPIPE or ECONNRESET), not the
    /// parent.
    #[test]
    fn a_child_gone_mid_request_ends_the_link_without_an_error() {
        let (parent, mut child) = UnixStream::pair().unwrap();
        let mut request = 16u32.to_le_bytes().to_vec();
        (0..16u32).for_each(|p| request.extend_from_slice(&p.to_le_bytes()));
        child.write_all(&request).unwrap();
        let sent = AtomicU64::new(0);
        let read = |_: u32, buf: &mut [u8]| {
            buf.fill(7);
            Ok(())
        };
        drop(child);
        assert_eq!(serve_link(parent, read, &sent).unwrap(), 0);
    }

    #[test]
    fn a_request_for_too_many_pages_is_an_error() {
        let (parent, mut child) = UnixStream::pair().unwrap();
        child.write_all(&(LINK_PAGES_MAX as u32 + 1).to_le_bytes()).unwrap();
        let read = |_: u32, _: &mut [u8]| Ok(());
        let err = serve_link(parent, read, &AtomicU64::new(0)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
