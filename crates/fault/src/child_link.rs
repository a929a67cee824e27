//! The socket between a forked child's handler and its parent: the child
//! asks for pages, the parent answers with their bytes as at the fork.
//!
//! Request: a u32 count (1..=`LINK_PAGES_MAX`), then that many u32 page
//! numbers, little-endian. Answer: a status byte (0: the pages follow,
//! each 4 KiB, in order; 1: the parent could not read them, nothing
//! follows). A request that breaks these rules ends the link.

use crate::child::ChildSource;
use memlend_store::PAGE_SIZE;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

/// Pages one request may ask for.
pub const LINK_PAGES_MAX: usize = 16;
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
        self.stream.write_all(&request)?;
        let mut status = [0u8];
        self.stream.read_exact(&mut status)?;
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
        match stream.read_exact(&mut count) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(sent),
            Err(e) => return Err(e),
        }
        let n = u32::from_le_bytes(count) as usize;
        if n == 0 || n > LINK_PAGES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("asked for {n} pages")));
        }
        let mut pages = [0u8; 4 * LINK_PAGES_MAX];
        stream.read_exact(&mut pages[..4 * n])?;
        let pages =
            pages[..4 * n].chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let mut failed = None;
        for (i, page) in pages.enumerate() {
            if let Err(e) = read(page, &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]) {
                failed = Some(e);
                break;
            }
        }
        match failed {
            None => {
                stream.write_all(&[OK])?;
                stream.write_all(&buf[..n * PAGE_SIZE])?;
                sent += n as u64;
                sent_total.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Some(e) => {
                tracing::error!("a forked child's far pages: {e}");
                stream.write_all(&[FAILED])?;
            }
        }
    }
}
