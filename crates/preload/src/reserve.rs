//! Reservations: anonymous memory mapped `PROT_NONE` and committed later,
//! a piece at a time, the way a JVM reserves its heap (and its code cache),
//! and Go and V8 their arenas:
//!
//! ```text
//! mmap(NULL, 1 GiB, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)  reserve
//! mmap(addr, 396 MiB, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED)  commit
//! mmap(addr, n, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED|MAP_NORESERVE)  uncommit
//! munmap(addr, 1 GiB)  release
//! ```
//!
//! A reservation of the threshold or more (or of 256 KiB, whichever is less)
//! is carved from the far region like
//! any large mmap and made `PROT_NONE` there (`mprotect`: the range keeps its
//! userfaultfd registration). A `MAP_FIXED` anonymous private mapping that
//! lands wholly on far mappings the program owns is done in place: the pages
//! are dropped (as the kernel's replacement would, and the store's copies
//! with them) and the protection set, so the registration stays and the
//! committed pages are far. `mprotect` commits need nothing: it is the
//! kernel's, and the range stays registered. munmap gives the range back
//! read-write (`ops::munmap`).

use crate::{far, ops, sys};
use memlend_store::PAGE_SIZE;
use std::ffi::c_void;
use std::sync::atomic::Ordering::Relaxed;

/// A reservation the far heap takes: anonymous, private, PROT_NONE, placed
/// anywhere (a hint is only a hint), the threshold or more.
pub fn is_reservation(prot: i32, flags: i32, fd: i32) -> bool {
    ops::plain_anonymous(flags, fd) && prot == libc::PROT_NONE
}

/// Reservations from this size up are far even under a larger threshold:
/// V8 reserves its heap a 256 KiB page at a time (Node.js held 350 MiB
/// resident for 600 MiB of objects with only 1 MiB reservations far, 128 MiB
/// with these too, under `--mem 128M`).
const RESERVATION_MIN_BYTES: usize = 256 << 10;

/// Reserve `len` bytes of far memory, PROT_NONE. `None`: pass to the kernel.
pub fn reserve(hint: usize, len: usize) -> Option<*mut c_void> {
    if len < far::THRESHOLD.load(Relaxed).min(RESERVATION_MIN_BYTES) {
        return None;
    }
    let p = ops::map_far(hint, len)?;
    // Fenced first, then emptied: prefetch may have mapped pages ahead into
    // this range while it was free, and a page left there once it is
    // PROT_NONE could never move out.
    fence(p as usize, len, libc::PROT_NONE);
    drop_pages(p as usize, len);
    // SAFETY: `p..p + len` is a far block just handed to this caller.
    if unsafe { sys::mprotect(p, len, libc::PROT_NONE) } == 0 {
        return Some(p);
    }
    ops::munmap(p as usize, len);
    None
}

/// A MAP_FIXED anonymous private mapping at `addr`: in place if it lies
/// wholly on far mappings the program owns. `None`: not ours (the kernel's).
pub fn place(addr: usize, len: usize, prot: i32, flags: i32, fd: i32) -> Option<*mut c_void> {
    let fixed = flags & libc::MAP_FIXED != 0 && flags & libc::MAP_FIXED_NOREPLACE == 0;
    let anon_private =
        sys::map_type(flags) == libc::MAP_PRIVATE && flags & libc::MAP_ANONYMOUS != 0;
    let odd = libc::MAP_HUGETLB | libc::MAP_GROWSDOWN | libc::MAP_STACK;
    if !fixed || !anon_private || fd != -1 || flags & odd != 0 || len == 0 {
        return None;
    }
    if !far::contains(addr) || !addr.is_multiple_of(PAGE_SIZE) {
        return None;
    }
    let heap = far::heap()?;
    let pages = len.div_ceil(PAGE_SIZE) as u64;
    let page = heap.page_of(addr);
    if !far::contains(addr + len - 1) || !heap.arena().mapped_cover(page, pages) {
        return None;
    }
    if len >= far::THRESHOLD.load(Relaxed) {
        crate::seen::saw(crate::seen::Kind::Committed, len);
    }
    // An uncommit is fenced before its pages go, so that nothing is mapped
    // ahead into it between the drop and the mprotect; a commit is opened
    // after.
    if prot == libc::PROT_NONE {
        fence(addr, len, prot);
    }
    heap.discard(page, pages);
    // SAFETY: the range is the caller's far mapping (checked above), whose
    // contents it asked to replace.
    if unsafe { sys::mprotect(addr as *mut c_void, pages as usize * PAGE_SIZE, prot) } != 0 {
        return Some(libc::MAP_FAILED); // errno is mprotect's (EINVAL, ENOMEM)
    }
    fence(addr, len, prot);
    Some(addr as *mut c_void)
}

/// mprotect of far memory the program owns: the kernel's to do; the
/// handler is told what is inaccessible now, so that it maps nothing there
/// ahead of a fault (`memlend_fault::Region::fence`).
pub fn protected(addr: usize, len: usize, prot: i32) {
    if len == 0 || !far::contains(addr) || !addr.is_multiple_of(PAGE_SIZE) {
        return;
    }
    let Some(heap) = far::heap() else { return };
    let end = (addr + len).min(heap.addr(heap.region.len() as u64 / PAGE_SIZE as u64));
    fence(addr, end - addr, prot);
}

/// Drop whatever is mapped in `addr..+len` (far memory).
fn drop_pages(addr: usize, len: usize) {
    let Some(heap) = far::heap() else { return };
    heap.discard(heap.page_of(addr), len.div_ceil(PAGE_SIZE) as u64);
}

/// Fence `addr..+len` (far memory) if `prot` is PROT_NONE, else open it.
fn fence(addr: usize, len: usize, prot: i32) {
    let Some(heap) = far::heap() else { return };
    heap.fence(heap.page_of(addr), len.div_ceil(PAGE_SIZE) as u64, prot == libc::PROT_NONE);
}
