//! The kernel's memory calls, made directly: the shim exports `mmap`,
//! `munmap`, `mremap` and `madvise` itself, so reaching the real ones
//! through libc would come straight back here.

use std::ffi::c_void;

/// # Safety
/// As mmap(2): the caller owns whatever a MAP_FIXED mapping replaces.
pub unsafe fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    // SAFETY: forwarded as is; the kernel validates every argument.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// # Safety
/// As munmap(2): nothing may use the range afterwards.
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 }
}

/// # Safety
/// As mremap(2).
pub unsafe fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: forwarded as is.
    unsafe {
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}

/// # Safety
/// As madvise(2): MADV_DONTNEED and the like discard the range's contents.
pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as i32 }
}

/// # Safety
/// As mprotect(2): code that relies on the old protection breaks.
pub unsafe fn mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as i32 }
}

/// An mmap's mapping type, its flags' low bits: MAP_SHARED (1), MAP_PRIVATE
/// (2) or MAP_SHARED_VALIDATE (3), which has MAP_PRIVATE's bit, so the type
/// is compared whole, never tested bit by bit.
pub fn map_type(flags: i32) -> i32 {
    flags & 0x0f
}

pub fn set_errno(e: i32) {
    // SAFETY: the calling thread's errno slot is always valid.
    unsafe { *libc::__errno_location() = e }
}
