//! Per-page tables that cost no memory until written: the allocator hands
//! out fresh zeroed pages (calloc), so a table for a sparse 64 GiB store
//! only grows with the pages in use. Shared by `checksum`, `mirror`, `crypt`.

use crate::{StoreError, StoreResult, PAGE_SIZE};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Types for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for types whose every all-zero bit pattern is valid.
pub(crate) unsafe trait ZeroValid: Sized {}
// SAFETY: atomics have the layout of their integer, and 0 is an integer.
unsafe impl ZeroValid for AtomicU16 {}
// SAFETY: as above.
unsafe impl ZeroValid for AtomicU32 {}
// SAFETY: as above.
unsafe impl ZeroValid for AtomicU64 {}

/// A boxed slice of `len` zeroed `T`, allocated lazily by the kernel.
pub(crate) fn zeroed<T: ZeroValid>(len: u64, what: &str) -> StoreResult<Box<[T]>> {
    let too_many = || StoreError::NoSpace(format!("no memory for the {what} of {len} pages"));
    let len = usize::try_from(len).map_err(|_| too_many())?;
    if len == 0 {
        return Ok(Vec::new().into_boxed_slice());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| too_many())?;
    // SAFETY: the layout has a non-zero size (len > 0; every ZeroValid type
    // is at least 2 bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(too_many());
    }
    // SAFETY: `ptr` is a fresh allocation with the layout of `[T; len]`,
    // which a boxed slice frees with that same layout; all-zero bytes are a
    // valid `T` (ZeroValid).
    Ok(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) })
}

/// One CRC32C per page, stored as `crc ^ crc(zero page)` so that the table's
/// initial zeroes mean "every page is zero". Callers order updates with
/// stripe locks, so relaxed atomics suffice.
pub(crate) struct Sums {
    table: Box<[AtomicU32]>,
    zero_crc: u32,
}

impl Sums {
    pub(crate) fn new(pages: u64) -> StoreResult<Sums> {
        let zero_crc = crc32c::crc32c(&[0u8; PAGE_SIZE]);
        Ok(Sums { table: zeroed(pages, "checksums")?, zero_crc })
    }

    pub(crate) fn pages(&self) -> u64 {
        self.table.len() as u64
    }

    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.table)
    }

    pub(crate) fn expected(&self, page: u64) -> u32 {
        self.table[page as usize].load(Relaxed) ^ self.zero_crc
    }

    pub(crate) fn set(&self, page: u64, crc: u32) {
        self.table[page as usize].store(crc ^ self.zero_crc, Relaxed);
    }

    pub(crate) fn set_zero(&self, page: u64) {
        self.table[page as usize].store(0, Relaxed);
    }

    /// Whether `data` (one page) matches the sum recorded for `page`.
    pub(crate) fn matches(&self, page: u64, data: &[u8]) -> bool {
        crc32c::crc32c(data) == self.expected(page)
    }
}

/// One bit per page.
pub(crate) struct Bitmap {
    words: Box<[AtomicU64]>,
}

impl Bitmap {
    pub(crate) fn new(pages: u64, what: &str) -> StoreResult<Bitmap> {
        Ok(Bitmap { words: zeroed(pages.div_ceil(64), what)? })
    }

    pub(crate) fn set(&self, page: u64) {
        self.words[(page / 64) as usize].fetch_or(1 << (page % 64), Relaxed);
    }

    pub(crate) fn clear(&self, page: u64) {
        self.words[(page / 64) as usize].fetch_and(!(1 << (page % 64)), Relaxed);
    }

    pub(crate) fn get(&self, page: u64) -> bool {
        self.words[(page / 64) as usize].load(Relaxed) & (1 << (page % 64)) != 0
    }

    /// The word holding pages `64 * word .. 64 * word + 64`.
    pub(crate) fn word(&self, word: u64) -> u64 {
        self.words[word as usize].load(Relaxed)
    }

    pub(crate) fn words(&self) -> u64 {
        self.words.len() as u64
    }
}
