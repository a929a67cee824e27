//! The program's side: a shared anonymous mapping made far. Instead of the
//! kernel's anonymous shared memory, a memfd of the same size is mapped,
//! registered with a userfaultfd of its own (MISSING and WP faults), and
//! both descriptors go to the server, which from then on serves every
//! process that maps it. The maker keeps neither.
//!
//! A child forked after that maps the segment too, and must be served
//! from its first instruction. Where the kernel gives fork events (the
//! maker may ptrace: root), it registers the child's copy in the fork
//! itself and hands the server its descriptor. Where it does not, the
//! child registers itself before fork returns in it ([`join_shared`],
//! from the shim's fork handler), and until the server has its descriptor
//! the child runs nothing of the program's, so no access goes unserved.

use super::link::{self, Hello};
use crate::kernel::memfd::Memfd;
use crate::kernel::uffd::Uffd;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// A segment as the process that maps it knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub addr: usize,
    /// The server's number for it, for children to join.
    pub segment: u32,
    /// The kernel follows forks (a child needs no [`join_shared`]).
    pub forks_followed: bool,
}

/// Map `len_bytes` of shared memory served by the server at `sock`, with
/// `prot`. The pages start as zeroes, as anonymous memory does. On any
/// error nothing is left mapped.
pub fn map_shared(sock: &Path, len_bytes: usize, prot: i32) -> io::Result<Mapped> {
    let memfd = Memfd::create(len_bytes)?;
    let addr = memfd.map(len_bytes, prot)?;
    let handed = (|| {
        let (uffd, forks_followed) = Uffd::open_shared()?;
        uffd.register(addr, len_bytes, true)?;
        let hello =
            Hello { pid: std::process::id(), join: 0, base: addr as u64, len: len_bytes as u64 };
        let uffd_fd = owned(&uffd)?;
        let segment = link::offer(sock, hello, &[memfd.fd(), &uffd_fd])?;
        Ok(Mapped { addr, segment, forks_followed })
    })();
    if handed.is_err() {
        Memfd::unmap(addr, len_bytes);
    }
    handed
}

/// In a forked child whose kernel did not follow the fork: register the
/// child's copy of segment `m` and hand it to the server. On error the
/// copy is made inaccessible (an access is SIGSEGV, never a page of
/// zeroes where data was) and the error returned.
pub fn join_shared(sock: &Path, m: &Mapped, len_bytes: usize) -> io::Result<()> {
    let joined = (|| {
        let (uffd, _) = Uffd::open_shared()?;
        uffd.register(m.addr, len_bytes, true)?;
        let hello = Hello {
            pid: std::process::id(),
            join: m.segment,
            base: m.addr as u64,
            len: len_bytes as u64,
        };
        link::offer(sock, hello, &[&owned(&uffd)?]).map(|_| ())
    })();
    if joined.is_err() {
        Memfd::seal_off(m.addr, len_bytes);
    }
    joined
}

fn owned(uffd: &Uffd) -> io::Result<OwnedFd> {
    uffd.as_fd().try_clone_to_owned()
}
