//! Allocator operations on the far heap, in the terms the exported symbols
//! need. Each returns `None` when the request is not (or no longer) far, so
//! the caller passes it through to glibc or the kernel.

use crate::arena::Block;
use crate::libc_alloc as glibc;
use crate::{far, next, thread_kind};
use memlend_store::PAGE_SIZE;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

fn pages_for(bytes: usize) -> u64 {
    bytes.div_ceil(PAGE_SIZE).max(1) as u64
}

/// A far block of `size` bytes aligned to `align` (a power of two), zeroed.
/// `None`: not for far memory (pass through). `Some(null)`: ENOMEM.
pub fn alloc(size: usize, align: usize) -> Option<*mut c_void> {
    if size < far::THRESHOLD.load(Relaxed) {
        return None;
    }
    let Some(heap) = far::heap() else {
        return far::failed().then_some(null_mut());
    };
    let align_pages = (align / PAGE_SIZE).max(1) as u64;
    match heap.arena().alloc(pages_for(size), align_pages, size as u64, false) {
        Some(page) => {
            crate::seen::saw(crate::seen::Kind::Malloc, size);
            Some(heap.addr(page) as *mut c_void)
        }
        None => {
            full_once(size);
            None
        }
    }
}

/// When the far region is full, allocations go local, with one warning.
fn full_once(size: usize) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Relaxed) {
        tracing::warn!("far memory is full ({size} bytes asked); large allocations go local");
    }
}

/// The far malloc block starting at `ptr`, if it is one. Anything else in
/// the region (an object another allocator carved from memory it got from
/// our mmap) belongs to that allocator.
pub fn malloc_block(ptr: *mut c_void) -> Option<(&'static far::Heap, u64, Block)> {
    // `contains` first: `heap` starts far memory if it has not started, and
    // a free of a local pointer must not (each process would lease its
    // far size from the donors at its first free).
    if !far::contains(ptr as usize) {
        return None;
    }
    let heap = far::heap()?;
    block_in(heap, ptr).map(|(page, block)| (heap, page, block))
}

/// In a forked child: the parent's far malloc block starting at `ptr`, as
/// at the fork (the fork handlers hold the arena still across it).
fn parent_block(ptr: *mut c_void) -> Option<Block> {
    if !far::in_child() {
        return None;
    }
    block_in(far::any_heap()?, ptr).map(|(_, block)| block)
}

fn block_in(heap: &far::Heap, ptr: *mut c_void) -> Option<(u64, Block)> {
    if !far::contains(ptr as usize) || !(ptr as usize).is_multiple_of(PAGE_SIZE) {
        return None;
    }
    let page = heap.page_of(ptr as usize);
    let block = heap.arena().block(page).filter(|b| !b.mapped)?;
    Some((page, block))
}

/// Free a far malloc block. `false`: not one of ours, pass it on.
pub fn free(ptr: *mut c_void) -> bool {
    if parent_block(ptr).is_some() {
        return true; // a forked child: the parent's block, kept as it was
    }
    let Some((heap, page, block)) = malloc_block(ptr) else { return false };
    heap.discard(page, block.pages);
    heap.arena().free(page);
    true
}

/// realloc in a forked child of its parent's far malloc block: a new block
/// (local: a child allocates no far memory) holding the old bytes, read
/// through the parent; the parent's block stays as it was. `None`: not
/// such a block.
pub fn realloc_parent_block(ptr: *mut c_void, size: usize) -> Option<*mut c_void> {
    let block = parent_block(ptr)?;
    if size == 0 {
        return Some(null_mut()); // a free, which in a child keeps the block
    }
    let new = malloc_any(size);
    if !new.is_null() {
        let n = (block.size_bytes as usize).min(size);
        // SAFETY: the parent's block holds `size_bytes` bytes, mapped in
        // this child (its handler reads them through the parent); `new`
        // holds `size` and is not in the region.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, n) };
    }
    Some(new)
}

/// Usable bytes of a far malloc block, or `None` if `ptr` is not one.
pub fn usable_size(ptr: *mut c_void) -> Option<usize> {
    let block = malloc_block(ptr).map(|(_, _, block)| block).or_else(|| parent_block(ptr))?;
    Some(block.pages as usize * PAGE_SIZE)
}

/// realloc of a far block: shrink or grow in place when the arena allows,
/// else move (to far memory, or local if the new size is small).
/// `ptr` must be a far malloc block (see [`malloc_block`]).
pub fn realloc_far(
    heap: &far::Heap,
    ptr: *mut c_void,
    page: u64,
    block: Block,
    size: usize,
) -> *mut c_void {
    // A shrink stays in place (even below the threshold: a copy to local
    // memory would fault every page in); a grow stays if the pages after
    // the block are free.
    let pages = pages_for(size);
    if pages < block.pages {
        heap.discard(page + pages, block.pages - pages);
    }
    if heap.arena().resize(page, pages, size as u64).is_some() {
        return ptr;
    }
    move_block(ptr, block.size_bytes as usize, size)
}

fn move_block(ptr: *mut c_void, old_bytes: usize, size: usize) -> *mut c_void {
    let new = malloc_any(size);
    if !new.is_null() {
        let n = old_bytes.min(size);
        // SAFETY: both blocks hold at least `n` bytes; a new block never
        // overlaps a live one.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, new as *mut u8, n) };
        free(ptr);
    }
    new
}

/// An anonymous private mapping placed anywhere (a hint is only a hint),
/// with none of the flags the far heap does not take: whatever its
/// protection, the far heap can hold it.
pub fn plain_anonymous(flags: i32, fd: i32) -> bool {
    let wanted = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let refused = libc::MAP_FIXED
        | libc::MAP_FIXED_NOREPLACE
        | libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK
        | libc::MAP_POPULATE;
    crate::sys::map_type(flags) == libc::MAP_PRIVATE
        && flags & wanted == wanted
        && flags & refused == 0
        && fd == -1
}

/// mmap of anonymous private read-write memory from the far heap, at the
/// hinted address when that is free. `None`: not far.
pub fn mmap(hint: usize, len: usize) -> Option<*mut c_void> {
    if len < far::THRESHOLD.load(Relaxed) {
        return None;
    }
    map_far(hint, len)
}

/// A far block of `len` bytes for a mapping, whatever its size (the caller
/// chose it as far), at `hint` if that is free. `None`: no room, or no heap.
pub fn map_far(hint: usize, len: usize) -> Option<*mut c_void> {
    let heap = far::heap()?;
    let pages = pages_for(len);
    let mut arena = heap.arena();
    if hint != 0 && far::contains(hint) && hint.is_multiple_of(PAGE_SIZE) {
        let page = heap.page_of(hint);
        if arena.alloc_at(page, pages, len as u64, true) {
            return Some(hint as *mut c_void);
        }
    }
    arena.alloc(pages, 1, len as u64, true).map(|page| heap.addr(page) as *mut c_void)
}

/// munmap of (part of) the far heap. `None`: not far.
pub fn munmap(addr: usize, len: usize) -> Option<i32> {
    if !far::contains(addr) {
        return None;
    }
    let Some(heap) = far::heap() else { return Some(0) };
    if !addr.is_multiple_of(PAGE_SIZE) || len == 0 {
        crate::sys::set_errno(libc::EINVAL);
        return Some(-1);
    }
    let (page, pages) = (heap.page_of(addr), pages_for(len));
    let end = (page + pages).min(heap.region.len() as u64 / PAGE_SIZE as u64);
    heap.discard(page, end - page);
    // A reservation (`reserve.rs`) or a placement may have left the range
    // PROT_NONE or executable: the next owner gets plain read-write pages.
    let bytes = (end - page) as usize * PAGE_SIZE;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: the range is far memory the caller gives up.
    if unsafe { crate::sys::mprotect(addr as *mut c_void, bytes, rw) } != 0 {
        tracing::warn!("far munmap: restoring read-write at {addr:#x}+{bytes} failed");
    }
    heap.fence(page, end - page, false);
    heap.arena().free_range(page, end - page, |_, _| {});
    Some(0)
}

/// mremap of a far block: in place if the arena allows, else (MAYMOVE) a
/// new block and a copy. `None`: not far.
pub fn mremap(old: usize, old_len: usize, new_len: usize, flags: i32) -> Option<*mut c_void> {
    if !far::contains(old) {
        return None;
    }
    let fail = |e| {
        crate::sys::set_errno(e);
        Some(libc::MAP_FAILED)
    };
    let Some(heap) = far::heap() else { return fail(libc::EFAULT) };
    if flags & libc::MREMAP_FIXED != 0 || new_len == 0 {
        return fail(libc::EINVAL);
    }
    let page = heap.page_of(old);
    let Some(block) = heap.arena().block(page) else { return fail(libc::EINVAL) };
    let pages = pages_for(new_len);
    if pages < block.pages {
        heap.discard(page + pages, block.pages - pages);
    }
    if heap.arena().resize(page, pages, new_len as u64).is_some() {
        return Some(old as *mut c_void);
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return fail(libc::ENOMEM);
    }
    let new = mmap_any(new_len);
    if new == libc::MAP_FAILED {
        return Some(new);
    }
    // SAFETY: the old block holds `old_len` bytes (checked against the
    // block), the new one `new_len`; they do not overlap.
    unsafe {
        let n = old_len.min(new_len).min(block.pages as usize * PAGE_SIZE);
        std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, n);
    }
    munmap(old, block.pages as usize * PAGE_SIZE);
    Some(new)
}

/// malloc for the shim's own use (realloc moves): far or glibc.
pub fn malloc_any(size: usize) -> *mut c_void {
    if thread_kind::ours() {
        // SAFETY: glibc's malloc.
        return unsafe { glibc::__libc_malloc(size) };
    }
    match alloc(size, 1) {
        Some(p) => enomem_if_null(p),
        None => next::malloc(size),
    }
}

/// An anonymous read-write mapping for mremap moves: far or the kernel's.
pub fn mmap_any(len: usize) -> *mut c_void {
    if let Some(p) = mmap(0, len) {
        return p;
    }
    let (prot, flags) =
        (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    // SAFETY: a fresh mapping at an address of the kernel's choosing.
    unsafe { crate::sys::mmap(null_mut(), len, prot, flags, -1, 0) }
}

pub fn enomem_if_null(p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        crate::sys::set_errno(libc::ENOMEM);
    }
    p
}
