//! `checksum`: a CRC32C of every page, kept in memory, checked on every read.
//!
//! It catches what the store below returns wrongly: a flipped bit on an SSD,
//! a file changed behind our back, a donor that sends the wrong page. The
//! sums cost 4 bytes a page and live in this process; they are lost when it
//! exits, so a persistent store reopened later must be wrapped with
//! [`Checksum::scan`], which learns the sums from the contents.
//!
//! The table holds `crc ^ ZERO_PAGE_CRC`, so that its initial all-zero
//! memory means "every page is zero": a fresh table costs no memory until
//! pages are written, like the sparse backends below it.
//!
//! Concurrency. The inner store makes each page atomic, but a page and its
//! sum are two things, updated one after the other. So:
//! - writers and discarders own the pages' stripe locks across the inner
//!   operation *and* the sum update, which makes (data, sum) change together
//!   and in the same order as the data. Without this, two racing writes of
//!   one page could land as data A with sum B for good;
//! - readers take no lock: they read, then compare with the sum they see.
//!   A match means the data is intact (whichever version it is). A mismatch
//!   may only be a race with a writer between its data and its sum, so the
//!   page is read once more under its stripe's shared lock, where no writer
//!   is mid-update and data and sum must agree. Only a mismatch there is
//!   reported, as `StoreError::Corrupt`. The lock orders everything, so the
//!   sums themselves need only relaxed atomics.

use super::table::Sums;
use crate::page_locks::{LockSet, PageLocks};
use crate::{check_range, check_run, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use crate::{WriteOp, PAGE_SIZE};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Pages read at a time by `scan` and by the repair after a failed write.
const SCAN_PAGES: u64 = 64;

/// Wraps `S` and verifies every page read against the CRC32C it was written
/// with; see the module documentation for the concurrency argument.
pub struct Checksum<S> {
    inner: S,
    sums: Sums,
    stripes: PageLocks,
    corrupt_pages: AtomicU64,
}

impl<S: PageStore> Checksum<S> {
    /// In-memory metadata per page of the store.
    pub const METADATA_BYTES_PER_PAGE: usize = std::mem::size_of::<AtomicU32>();

    /// Wrap a store whose pages all read as zero (a fresh one).
    pub fn new(inner: S) -> StoreResult<Self> {
        let sums = Sums::new(inner.info().pages)?;
        Ok(Checksum { inner, sums, stripes: PageLocks::new(), corrupt_pages: AtomicU64::new(0) })
    }

    /// Wrap a store with contents (a file opened again): read every page
    /// once to learn its sum.
    pub fn scan(inner: S) -> StoreResult<Self> {
        let store = Self::new(inner)?;
        let pages = store.sums.pages();
        for first in (0..pages).step_by(SCAN_PAGES as usize) {
            store.learn(first, SCAN_PAGES.min(pages - first))?;
        }
        Ok(store)
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Pages whose contents did not match their sum, since the layer was made.
    pub fn corrupt_pages(&self) -> u64 {
        self.corrupt_pages.load(Relaxed)
    }

    /// Bytes of per-page metadata this layer holds (the fixed stripe table
    /// aside).
    pub fn metadata_bytes(&self) -> usize {
        self.sums.bytes()
    }

    fn expected(&self, page: u64) -> u32 {
        self.sums.expected(page)
    }

    fn set(&self, page: u64, crc: u32) {
        self.sums.set(page, crc);
    }

    /// Read `page..page + count` from the inner store and take what is there
    /// as the truth. The caller owns those stripes, or nobody else runs yet.
    fn learn(&self, page: u64, count: u64) -> StoreResult<()> {
        assert!(count <= SCAN_PAGES);
        let mut buf = vec![0u8; count as usize * PAGE_SIZE];
        self.inner.read(&mut [ReadOp { page, buf: &mut buf }])?;
        for (i, chunk) in buf.chunks_exact(PAGE_SIZE).enumerate() {
            self.set(page + i as u64, crc32c::crc32c(chunk));
        }
        Ok(())
    }

    /// After an inner write or discard failed part-way, the pages hold some
    /// mix of old and new: learn what they hold, so that a later read does
    /// not report our own failure as corruption.
    fn relearn(&self, page: u64, count: u64) {
        for first in (page..page + count).step_by(SCAN_PAGES as usize) {
            let chunk = SCAN_PAGES.min(page + count - first);
            if let Err(e) = self.learn(first, chunk) {
                tracing::warn!(page = first, error = %e, "cannot re-read after a failed update");
            }
        }
    }

    /// Check one page that a lockless read found wrong, reading it again
    /// under its stripe's shared lock; only a mismatch there is corruption.
    fn recheck(&self, page: u64, buf: &mut [u8]) -> StoreResult<()> {
        let _shared = self.stripes.read_page(page);
        self.inner.read(&mut [ReadOp { page, buf: &mut *buf }])?;
        let (expected, actual) = (self.expected(page), crc32c::crc32c(buf));
        if expected == actual {
            return Ok(());
        }
        self.corrupt_pages.fetch_add(1, Relaxed);
        tracing::warn!(page, expected, actual, "page failed its checksum");
        // `Caps::checked`: a page not vouched for reads as zeroes.
        buf.fill(0);
        Err(StoreError::Corrupt { page, expected, actual })
    }
}

impl<S: PageStore> PageStore for Checksum<S> {
    fn info(&self) -> StoreInfo {
        let inner = self.inner.info();
        let caps = crate::Caps { checked: true, ..inner.caps };
        StoreInfo { name: format!("checksum({})", inner.name), caps, ..inner }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        let pages = self.sums.pages();
        for op in ops.iter() {
            check_run(pages, op.page, op.buf.len())?;
        }
        self.inner.read(ops)?;
        let mut first_error = None;
        for op in ops.iter_mut() {
            for (i, chunk) in op.buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let page = op.page + i as u64;
                if crc32c::crc32c(chunk) == self.expected(page) {
                    continue;
                }
                if let Err(e) = self.recheck(page, chunk) {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let pages = self.sums.pages();
        let mut set = LockSet::new();
        for op in ops {
            set.add_run(op.page, check_run(pages, op.page, op.data.len())?);
        }
        // Sums are computed before the locks are taken, to hold them briefly.
        let crcs: Vec<u32> =
            ops.iter().flat_map(|op| op.data.chunks_exact(PAGE_SIZE)).map(crc32c::crc32c).collect();
        let _owned = self.stripes.write(&set);
        if let Err(e) = self.inner.write(ops) {
            for op in ops {
                self.relearn(op.page, (op.data.len() / PAGE_SIZE) as u64);
            }
            return Err(e);
        }
        let pages_written =
            ops.iter().flat_map(|op| (0..(op.data.len() / PAGE_SIZE) as u64).map(|i| op.page + i));
        for (page, crc) in pages_written.zip(crcs) {
            self.set(page, crc);
        }
        Ok(())
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.sums.pages(), page, count)?;
        let _owned = self.stripes.write(&LockSet::of_run(page, count));
        if let Err(e) = self.inner.discard(page, count) {
            self.relearn(page, count);
            return Err(e);
        }
        for p in page..page + count {
            self.sums.set_zero(p);
        }
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }
}

/// What this layer adds, in a named stack's help and errors.
pub(crate) const ADDS: &str = "a CRC32C of every page, checked on every read";

/// This layer in a named stack (`registry.rs`): over any store, reporting
/// the corrupt pages it caught.
pub(crate) fn named(
    base: Arc<dyn PageStore>,
    reports: &mut Vec<super::report::Report>,
) -> StoreResult<Arc<dyn PageStore>> {
    let layer = Arc::new(Checksum::new(base)?);
    let seen = Arc::clone(&layer);
    reports.push(Box::new(move || format!("checksum: {} corrupt pages", seen.corrupt_pages())));
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};

    fn ram(pages: u64) -> RamStore {
        RamStore::new(pages, RamOptions::default()).unwrap()
    }

    #[test]
    fn metadata_is_at_most_16_bytes_per_page() {
        const { assert!(Checksum::<RamStore>::METADATA_BYTES_PER_PAGE <= 16) };
        let pages = 1 << 20;
        let s = Checksum::new(ram(pages)).unwrap();
        assert_eq!(s.metadata_bytes(), 4 * pages as usize);
        assert!(s.metadata_bytes() <= 16 * pages as usize);
    }

    #[test]
    fn fresh_store_reads_zero_and_writes_verify() {
        let s = Checksum::new(ram(8)).unwrap();
        assert_eq!(s.info().name, "checksum(ram)");
        let mut buf = vec![9u8; 2 * PAGE_SIZE];
        s.read(&mut [ReadOp { page: 6, buf: &mut buf }]).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        let data: Vec<u8> = (0..2 * PAGE_SIZE).map(|i| i as u8).collect();
        s.write(&[WriteOp { page: 6, data: &data }]).unwrap();
        s.read(&mut [ReadOp { page: 6, buf: &mut buf }]).unwrap();
        assert_eq!(buf, data);
        s.discard(6, 1).unwrap();
        s.read(&mut [ReadOp { page: 6, buf: &mut buf }]).unwrap();
        assert!(buf[..PAGE_SIZE].iter().all(|&b| b == 0));
        assert_eq!(s.corrupt_pages(), 0);
    }

    #[test]
    fn corruption_below_the_layer_is_reported_and_counted() {
        let s = Checksum::new(std::sync::Arc::new(ram(8))).unwrap();
        s.write(&[WriteOp { page: 2, data: &[5u8; PAGE_SIZE] }]).unwrap();
        // Change page 2 behind the layer's back.
        s.inner().write(&[WriteOp { page: 2, data: &[6u8; PAGE_SIZE] }]).unwrap();
        let mut buf = vec![0u8; 3 * PAGE_SIZE];
        let err = s.read(&mut [ReadOp { page: 1, buf: &mut buf }]).unwrap_err();
        let (want, got) = (crc32c::crc32c(&[5u8; PAGE_SIZE]), crc32c::crc32c(&[6u8; PAGE_SIZE]));
        let StoreError::Corrupt { page, expected, actual } = err else { panic!("{err}") };
        assert_eq!((page, expected, actual), (2, want, got));
        assert_eq!(s.corrupt_pages(), 1);
    }

    #[test]
    fn scan_learns_existing_contents() {
        let inner = ram(200);
        inner.write(&[WriteOp { page: 130, data: &[3u8; PAGE_SIZE] }]).unwrap();
        let s = Checksum::scan(inner).unwrap();
        let mut buf = vec![0u8; PAGE_SIZE];
        s.read(&mut [ReadOp { page: 130, buf: &mut buf }]).unwrap();
        assert_eq!(buf, vec![3u8; PAGE_SIZE]);
    }
}
