//! glibc's own allocator, reached by its `__libc_*` names so that no call
//! from the shim (or from the Rust code it links) can come back into the
//! shim's `malloc`: the shim's global allocator is this.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub fn __libc_free(ptr: *mut c_void);
}

/// malloc's own alignment on x86-64 and aarch64 glibc.
const MALLOC_ALIGN: usize = 16;

pub struct LibcAlloc;

// SAFETY: each method forwards to glibc's allocator, which returns memory
// valid for the layout (memalign for alignments beyond malloc's own) or null.
unsafe impl GlobalAlloc for LibcAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain glibc calls; a null return is passed on.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                __libc_malloc(layout.size()) as *mut u8
            } else {
                __libc_memalign(layout.align(), layout.size()) as *mut u8
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: as for `alloc`.
            return unsafe { __libc_calloc(1, layout.size()) as *mut u8 };
        }
        // SAFETY: `alloc` returned `layout.size()` writable bytes or null.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from glibc.
        unsafe { __libc_free(ptr as *mut c_void) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: `ptr` came from glibc malloc with this alignment.
            return unsafe { __libc_realloc(ptr as *mut c_void, new_size) as *mut u8 };
        }
        // SAFETY: the new block holds `new_size` bytes; the old one
        // `layout.size()`; we copy the smaller and free the old.
        unsafe {
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}
