//! The maker's side: a shared anonymous mapping made far. Instead of the
//! kernel's anonymous shared memory, a memfd of the same size is mapped,
//! registered with a userfaultfd of its own (MISSING and WP faults, FORK
//! events), and both descriptors go to the server, which from then on
//! serves every process that maps it. The maker keeps neither.

use super::link::{self, Hello};
use crate::kernel::memfd::Memfd;
use crate::kernel::uffd::Uffd;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

/// Map `len_bytes` of shared memory served by the server at `sock`, with
/// `prot`. The pages start as zeroes, as anonymous memory does. On any
/// error nothing is left mapped.
pub fn map_shared(sock: &Path, len_bytes: usize, prot: i32) -> io::Result<usize> {
    let memfd = Memfd::create(len_bytes)?;
    let addr = memfd.map(len_bytes, prot)?;
    let handed = (|| {
        let uffd = Uffd::open_shared()?;
        uffd.register(addr, len_bytes, true)?;
        let hello = Hello { pid: std::process::id(), base: addr as u64, len: len_bytes as u64 };
        let uffd_fd = uffd.as_fd().try_clone_to_owned()?;
        link::offer(sock, hello, memfd.fd(), &uffd_fd)
    })();
    match handed {
        Ok(()) => Ok(addr),
        Err(e) => {
            Memfd::unmap(addr, len_bytes);
            tracing::debug!(fd = memfd.fd().as_raw_fd(), "shared segment not served: {e}");
            Err(e)
        }
    }
}
