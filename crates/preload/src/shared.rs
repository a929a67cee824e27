//! Shared anonymous memory made far (PostgreSQL's shared buffers): a
//! `MAP_SHARED | MAP_ANONYMOUS` mapping from the threshold up becomes a
//! segment served by `memlend run`'s shared-memory server
//! (`memlend_fault::shmem`), in this process and in every child it forks.
//!
//! The segments this process made or inherited are kept in a fixed table
//! (a fork copies it), so that `mremap` of one is refused: the server
//! knows each segment at one address in every process.

use crate::{far, seen, thread_kind};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

/// The most segments one process keeps track of; past it, shared mappings
/// pass to the kernel.
const SEGMENTS_MAX: usize = 64;

static BASES: [AtomicUsize; SEGMENTS_MAX] = [const { AtomicUsize::new(0) }; SEGMENTS_MAX];
static LENS: [AtomicUsize; SEGMENTS_MAX] = [const { AtomicUsize::new(0) }; SEGMENTS_MAX];
/// The server's number for each, and whether a fork must join it
/// (`memlend_fault::shmem::join_shared`): 0 where the kernel follows forks.
static TO_JOIN: [AtomicU32; SEGMENTS_MAX] = [const { AtomicU32::new(0) }; SEGMENTS_MAX];

/// A shared anonymous mapping the server can take: placed anywhere, with
/// none of the flags a memfd mapping would not honour.
pub fn eligible(len: usize, flags: i32, fd: i32) -> bool {
    let refused = libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK
        | libc::MAP_POPULATE
        | libc::MAP_LOCKED;
    crate::sys::map_type(flags) == libc::MAP_SHARED
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & refused == 0
        && fd == -1
        && len >= far::THRESHOLD.load(Relaxed)
        && !thread_kind::ours()
        && !far::starting()
}

/// Make the mapping a far segment. `None`: not served (no server, no
/// room in the table, or the server refused; logged once): the caller
/// passes it to the kernel.
pub fn map(len: usize, prot: i32) -> Option<*mut c_void> {
    let sock = far::shared_sock()?;
    let slot = BASES.iter().position(|b| b.load(Relaxed) == 0)?;
    // Its own mapping of the memfd is the shim's, not the program's.
    match thread_kind::while_ours(|| memlend_fault::shmem::map_shared(sock, len, prot)) {
        Ok(m) => {
            LENS[slot].store(len, Relaxed);
            TO_JOIN[slot].store(if m.forks_followed { 0 } else { m.segment }, Relaxed);
            BASES[slot].store(m.addr, Relaxed);
            seen::saw(seen::Kind::SharedFar, len);
            Some(m.addr as *mut c_void)
        }
        Err(e) => {
            refused_once(&e);
            None
        }
    }
}

fn refused_once(e: &std::io::Error) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        // Said whatever the log level: the user asked for far memory.
        eprintln!("memlend: shared memory stays local: the shared-memory server: {e}");
    }
}

/// Does `addr..addr + len` touch a far segment of this process?
pub fn overlaps(addr: usize, len: usize) -> bool {
    (0..SEGMENTS_MAX).any(|i| {
        let base = BASES[i].load(Relaxed);
        base != 0 && addr < base + LENS[i].load(Relaxed) && base < addr.saturating_add(len)
    })
}

/// In a forked child, before fork returns in it: join every segment the
/// kernel did not register for the child. A segment that cannot be joined
/// is made inaccessible (`join_shared`), with an error logged.
pub fn after_fork_in_child() {
    let Some(sock) = far::shared_sock() else { return };
    for i in 0..SEGMENTS_MAX {
        let (base, segment) = (BASES[i].load(Relaxed), TO_JOIN[i].load(Relaxed));
        if base == 0 || segment == 0 {
            continue;
        }
        let m = memlend_fault::shmem::Mapped { addr: base, segment, forks_followed: false };
        let len = LENS[i].load(Relaxed);
        if let Err(e) = memlend_fault::shmem::join_shared(sock, &m, len) {
            tracing::error!(
                "fork: shared segment at {base:#x} cannot be served here ({e}); touching it faults"
            );
        }
    }
}

/// munmap of all of a segment: its slot is free again (the server keeps
/// serving any other process that maps it).
pub fn unmapped(addr: usize, len: usize) {
    for i in 0..SEGMENTS_MAX {
        let base = BASES[i].load(Relaxed);
        if base != 0 && addr <= base && base + LENS[i].load(Relaxed) <= addr.saturating_add(len) {
            BASES[i].store(0, Relaxed);
        }
    }
}
