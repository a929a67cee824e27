//! Where calls that are not far go: the *next* allocator in link order,
//! found with dlsym(RTLD_NEXT). That is glibc's malloc for most programs,
//! and the program's own for those that bring one (redis-server links
//! jemalloc, which exports malloc too): a pointer must always go back to
//! the allocator that made it.
//!
//! Resolving happens on the first call. If dlsym allocates while we resolve
//! (it may, to report an error), that allocation comes from a small static
//! bump arena whose blocks are never freed.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::Acquire, Ordering::Release};

type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);
type Calloc = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type Realloc = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type Memalign = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type Usable = unsafe extern "C" fn(*mut c_void) -> usize;

static MALLOC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static FREE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static CALLOC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REALLOC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static MEMALIGN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static USABLE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static RESOLVED: AtomicBool = AtomicBool::new(false);
static RESOLVING: AtomicBool = AtomicBool::new(false);

/// Bytes for allocations made while resolving; dlsym needs a few hundred
/// at most.
const BOOT_BYTES: usize = 64 << 10;
const BOOT_ALIGN: usize = 16;
#[repr(align(4096))]
// Only ever reached through raw pointers.
#[allow(dead_code)]
struct Boot([u8; BOOT_BYTES]);
static mut BOOT: Boot = Boot([0; BOOT_BYTES]);
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

fn boot_range() -> (usize, usize) {
    let start = &raw const BOOT as usize;
    (start, start + BOOT_BYTES)
}

/// Is `ptr` one of the bootstrap arena's blocks (never freed)?
pub fn is_boot(ptr: *mut c_void) -> bool {
    let (start, end) = boot_range();
    (start..end).contains(&(ptr as usize))
}

/// A bump allocation, its size kept in the 16 bytes before it.
fn boot_alloc(size: usize) -> *mut c_void {
    let need = size.next_multiple_of(BOOT_ALIGN) + BOOT_ALIGN;
    let at = BOOT_USED.fetch_add(need, Acquire);
    if at + need > BOOT_BYTES {
        return std::ptr::null_mut();
    }
    let (start, _) = boot_range();
    let block = (start + at) as *mut usize;
    // SAFETY: [at, at + need) of BOOT is ours alone (fetch_add), in bounds.
    unsafe {
        block.write(size);
        block.cast::<u8>().add(BOOT_ALIGN).cast()
    }
}

fn boot_size(ptr: *mut c_void) -> usize {
    // SAFETY: `ptr` came from boot_alloc, which put the size before it.
    unsafe { ptr.cast::<u8>().sub(BOOT_ALIGN).cast::<usize>().read() }
}

fn resolve() {
    if RESOLVING.swap(true, Acquire) {
        return; // another thread is at it; meanwhile the boot arena serves
    }
    let find = |name: &CStr, into: &AtomicPtr<c_void>| {
        // SAFETY: dlsym with a NUL-terminated name.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        into.store(f, Release);
    };
    find(c"malloc", &MALLOC);
    find(c"free", &FREE);
    find(c"calloc", &CALLOC);
    find(c"realloc", &REALLOC);
    find(c"memalign", &MEMALIGN);
    find(c"malloc_usable_size", &USABLE);
    RESOLVED.store(true, Release);
}

/// The next allocator's function, or `None` while it is being found.
fn get(slot: &AtomicPtr<c_void>) -> Option<*mut c_void> {
    if !RESOLVED.load(Acquire) {
        resolve();
        if !RESOLVED.load(Acquire) {
            return None;
        }
    }
    let f = slot.load(Acquire);
    (!f.is_null()).then_some(f)
}

pub fn malloc(size: usize) -> *mut c_void {
    match get(&MALLOC) {
        // SAFETY: the next allocator's malloc, of type Malloc.
        Some(f) => unsafe { std::mem::transmute::<*mut c_void, Malloc>(f)(size) },
        None => boot_alloc(size),
    }
}

pub fn calloc(n: usize, size: usize) -> *mut c_void {
    match get(&CALLOC) {
        // SAFETY: the next allocator's calloc.
        Some(f) => unsafe { std::mem::transmute::<*mut c_void, Calloc>(f)(n, size) },
        // The boot arena is static memory never handed out twice: zero.
        None => n.checked_mul(size).map_or(std::ptr::null_mut(), boot_alloc),
    }
}

/// # Safety
/// `ptr` is null or came from the next allocator (or the boot arena).
pub unsafe fn free(ptr: *mut c_void) {
    if ptr.is_null() || is_boot(ptr) {
        return;
    }
    if let Some(f) = get(&FREE) {
        // SAFETY: the next allocator's free, on its own pointer.
        unsafe { std::mem::transmute::<*mut c_void, Free>(f)(ptr) }
    }
}

/// # Safety
/// As [`free`].
pub unsafe fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if is_boot(ptr) {
        let new = malloc(size);
        if !new.is_null() {
            // SAFETY: the boot block holds boot_size bytes, `new` holds `size`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ptr.cast::<u8>(),
                    new.cast(),
                    boot_size(ptr).min(size),
                )
            };
        }
        return new;
    }
    match get(&REALLOC) {
        // SAFETY: the next allocator's realloc on its own pointer.
        Some(f) => unsafe { std::mem::transmute::<*mut c_void, Realloc>(f)(ptr, size) },
        None => std::ptr::null_mut(),
    }
}

pub fn memalign(align: usize, size: usize) -> *mut c_void {
    match get(&MEMALIGN) {
        // SAFETY: the next allocator's memalign.
        Some(f) => unsafe { std::mem::transmute::<*mut c_void, Memalign>(f)(align, size) },
        None if align <= BOOT_ALIGN => boot_alloc(size),
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// As [`free`].
pub unsafe fn usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    if is_boot(ptr) {
        return boot_size(ptr);
    }
    match get(&USABLE) {
        // SAFETY: the next allocator's malloc_usable_size on its own pointer.
        Some(f) => unsafe { std::mem::transmute::<*mut c_void, Usable>(f)(ptr) },
        None => 0,
    }
}
