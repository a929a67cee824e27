//! The symbols a program's calls land on under LD_PRELOAD. Small requests
//! and anything not far go straight to the next allocator (see `next`) or
//! the kernel: the cost of the shim on them is one compare (sizes) or one
//! range check (pointers).

use crate::libc_alloc as glibc;
use crate::ops::enomem_if_null;
use crate::{far, next, ops, reserve, seen, shared, sys, thread_kind};
use std::ffi::c_void;
use std::ptr::null_mut;

/// Most alignment a far block can have: the arena aligns by pages, and a
/// larger alignment would waste a whole stretch of the region per block.
const FAR_ALIGN_MAX: usize = 1 << 30;

/// # Safety
/// The C contract of malloc.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    ops::malloc_any(size)
}

/// # Safety
/// The C contract of calloc. Far blocks are zero already: freed pages are
/// discarded before reuse.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    if thread_kind::ours() {
        // SAFETY: glibc's calloc.
        return unsafe { glibc::__libc_calloc(n, size) };
    }
    let Some(total) = n.checked_mul(size) else {
        sys::set_errno(libc::ENOMEM);
        return null_mut();
    };
    match ops::alloc(total, 1) {
        Some(p) => enomem_if_null(p),
        None => next::calloc(n, size),
    }
}

/// # Safety
/// The C contract of free.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if thread_kind::ours() {
        // SAFETY: our threads allocate from glibc only.
        return unsafe { glibc::__libc_free(ptr) };
    }
    if !ops::free(ptr) {
        // SAFETY: not far, so it came from the next allocator (or is null).
        unsafe { next::free(ptr) }
    }
}

/// # Safety
/// The C contract of realloc.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if thread_kind::ours() {
        // SAFETY: our threads allocate from glibc only.
        return unsafe { glibc::__libc_realloc(ptr, size) };
    }
    if ptr.is_null() {
        return ops::malloc_any(size);
    }
    if let Some(new) = ops::realloc_parent_block(ptr, size) {
        return new; // null: malloc set errno, or a realloc to 0 (a free)
    }
    if let Some((heap, page, block)) = ops::malloc_block(ptr) {
        if size == 0 {
            ops::free(ptr);
            return null_mut();
        }
        return ops::realloc_far(heap, ptr, page, block, size);
    }
    if size < far::THRESHOLD.load(std::sync::atomic::Ordering::Relaxed) {
        // SAFETY: `ptr` is the next allocator's.
        return unsafe { next::realloc(ptr, size) };
    }
    // A local block grows past the threshold: move it to far memory.
    let Some(new) = ops::alloc(size, 1).filter(|p| !p.is_null()) else {
        // SAFETY: `ptr` is the next allocator's.
        return unsafe { next::realloc(ptr, size) };
    };
    // SAFETY: `ptr` is the next allocator's and holds `usable` bytes;
    // `new` holds `size`.
    unsafe {
        let usable = next::usable_size(ptr);
        std::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, usable.min(size));
        next::free(ptr);
    }
    new
}

/// # Safety
/// The C contract of reallocarray.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(total) => unsafe { realloc(ptr, total) },
        None => {
            sys::set_errno(libc::ENOMEM);
            null_mut()
        }
    }
}

fn aligned(align: usize, size: usize) -> *mut c_void {
    if thread_kind::ours() {
        // SAFETY: glibc's memalign; `align` was checked by the caller.
        return unsafe { glibc::__libc_memalign(align, size) };
    }
    if align <= FAR_ALIGN_MAX {
        if let Some(p) = ops::alloc(size, align) {
            return enomem_if_null(p);
        }
    }
    next::memalign(align, size)
}

/// # Safety
/// The C contract of posix_memalign.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || align < size_of::<usize>() {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid pointer to store the result in.
    unsafe { *out = p };
    0
}

/// # Safety
/// The C contract of aligned_alloc.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        sys::set_errno(libc::EINVAL);
        return null_mut();
    }
    aligned(align, size)
}

/// # Safety
/// The C contract of memalign.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: as aligned_alloc.
    unsafe { aligned_alloc(align, size) }
}

/// # Safety
/// The C contract of valloc.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(4096, size)
}

/// # Safety
/// The C contract of pvalloc.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    aligned(4096, size.next_multiple_of(4096).max(4096))
}

/// # Safety
/// The C contract of malloc_usable_size.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if thread_kind::ours() {
        return 0;
    }
    if let Some(size) = ops::usable_size(ptr) {
        return size;
    }
    // SAFETY: not far, so the next allocator's.
    unsafe { next::usable_size(ptr) }
}

/// Is this mmap a plain anonymous private read-write one, placed anywhere?
fn far_mmap_eligible(prot: i32, flags: i32, fd: i32) -> bool {
    ops::plain_anonymous(flags, fd) && prot == libc::PROT_READ | libc::PROT_WRITE
}

/// # Safety
/// The C contract of mmap.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    if shared::eligible(len, flags, fd) {
        if let Some(p) = shared::map(len, prot) {
            return p;
        }
    }
    if far_mmap_eligible(prot, flags, fd) {
        if let Some(p) = ops::mmap(addr as usize, len) {
            seen::saw(seen::Kind::Private, len);
            return p;
        }
    } else if reserve::is_reservation(prot, flags, fd) && !thread_kind::ours() {
        if let Some(p) = reserve::reserve(addr as usize, len) {
            seen::saw(seen::Kind::Reserved, len);
            return p;
        }
    } else if let Some(p) = reserve::place(addr as usize, len, prot, flags, fd) {
        return p;
    }
    if len >= far::THRESHOLD.load(std::sync::atomic::Ordering::Relaxed)
        && !thread_kind::ours()
        && !far::starting()
    {
        if let Some(kind) = seen::kind_of_passed(prot, flags, fd) {
            seen::saw(kind, len);
        }
    }
    // SAFETY: passed through as asked.
    unsafe { sys::mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// The C contract of mmap64 (the same call on 64-bit).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    // SAFETY: as mmap.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// The C contract of mprotect.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    // SAFETY: passed through as asked.
    let rc = unsafe { sys::mprotect(addr, len, prot) };
    if rc == 0 {
        reserve::protected(addr as usize, len, prot);
    }
    rc
}

/// # Safety
/// The C contract of munmap.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    match ops::munmap(addr as usize, len) {
        Some(rc) => rc,
        None => {
            // SAFETY: passed through as asked.
            let rc = unsafe { sys::munmap(addr, len) };
            if rc == 0 {
                shared::unmapped(addr as usize, len);
            }
            rc
        }
    }
}

/// # Safety
/// The C contract of mremap. It is variadic in C; the fifth argument is
/// read only with MREMAP_FIXED, and on x86-64 and aarch64 a variadic
/// integer argument travels exactly like a fixed one.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    if shared::overlaps(old as usize, old_len) {
        // The server knows a segment at one address in every process.
        tracing::warn!("mremap of far shared memory refused (EINVAL)");
        sys::set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    match ops::mremap(old as usize, old_len, new_len, flags) {
        Some(p) => p,
        // SAFETY: passed through as asked.
        None => unsafe { sys::mremap(old, old_len, new_len, flags, new_addr) },
    }
}

/// # Safety
/// The C contract of madvise. On far memory: huge-page advice is dropped
/// (the fault handler maps and evicts 4 KiB pages); MADV_FREE becomes
/// MADV_DONTNEED, which it may always act as, because the kernel would
/// drop a freed page without telling the handler, and the handler writes
/// to pages a fork shared, which must not vanish under it (`moveout.rs`);
/// in a forked child, pages dropped read zero from then on (`fork/`).
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    const MADV_COLLAPSE: i32 = 25;
    let ignored = [libc::MADV_HUGEPAGE, libc::MADV_NOHUGEPAGE, libc::MADV_DOFORK, MADV_COLLAPSE];
    let mut advice = advice;
    if far::contains(addr as usize) {
        if ignored.contains(&advice) {
            return 0;
        }
        if advice == libc::MADV_FREE && far::follows_fork() {
            advice = libc::MADV_DONTNEED;
        }
        let drops = [libc::MADV_DONTNEED, libc::MADV_REMOVE];
        if far::in_child() && drops.contains(&advice) {
            crate::fork::child_discards(addr as usize, len);
        }
    }
    // SAFETY: passed through as asked.
    unsafe { sys::madvise(addr, len, advice) }
}
