//! `ram`: pages in an anonymous mapping of this process.
//!
//! Sparse by default: the mapping is reserved with `MAP_NORESERVE` and
//! transparent huge pages are off, so resident memory grows by 4 KiB per page
//! actually written and shrinks again on `discard` (`MADV_DONTNEED`). Reads of
//! untouched pages map the kernel's shared zero page and cost no memory.
//! Metadata is a fixed table of stripe locks, independent of the size.

use crate::page_locks::{LockSet, PageLocks};
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use crate::{InPlace, WriteOp, PAGE_SIZE};
use std::ptr::NonNull;

/// How the mapping is backed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RamOptions {
    /// Fault every page in up front (and allow huge pages) instead of growing
    /// with use.
    pub prealloc: bool,
    /// Lock pages in RAM so a donor's lent memory is never swapped out. With
    /// `prealloc` the whole slab is locked at once; without it, pages are
    /// locked as they are first touched (`MLOCK_ONFAULT`).
    pub mlock: bool,
}

pub struct RamStore {
    base: NonNull<u8>,
    pages: u64,
    /// Make each page atomic for concurrent readers and writers on
    /// different connections, without per-page metadata.
    stripes: PageLocks,
}

// SAFETY: the mapping is owned by the store for its whole life and every
// access to it goes through a stripe lock, so sharing across threads is sound.
unsafe impl Send for RamStore {}
// SAFETY: as above.
unsafe impl Sync for RamStore {}

impl RamStore {
    /// Map `pages` pages. Fails cleanly (no abort) when the kernel refuses.
    pub fn new(pages: u64, opts: RamOptions) -> StoreResult<Self> {
        let len = usize::try_from(pages)
            .ok()
            .and_then(|p| p.checked_mul(PAGE_SIZE))
            .filter(|&l| l > 0)
            .ok_or_else(|| StoreError::NoSpace(format!("cannot map {pages} pages")))?;
        // Not MAP_POPULATE: that faults every page in before `apply_options`
        // can ask for huge pages, so a preallocated slab got 4 KiB pages.
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(StoreError::NoSpace(format!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let base = NonNull::new(ptr.cast::<u8>()).expect("mmap returned null without MAP_FAILED");
        let store = RamStore { base, pages, stripes: PageLocks::new() };
        store.apply_options(len, opts)?;
        Ok(store)
    }

    fn apply_options(&self, len: usize, opts: RamOptions) -> StoreResult<()> {
        let advice = if opts.prealloc { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: advice on our own mapping; it changes no contents. Failure
        // (THP compiled out) only loses an optimisation, so it is ignored.
        unsafe { libc::madvise(self.base.as_ptr().cast(), len, advice) };
        if opts.prealloc {
            self.populate(len)?;
        }
        if opts.mlock {
            let flags = if opts.prealloc { 0 } else { libc::MLOCK_ONFAULT };
            // SAFETY: locks pages of our own mapping; no memory is accessed.
            let rc = unsafe { libc::mlock2(self.base.as_ptr().cast(), len, flags) };
            if rc != 0 {
                return Err(StoreError::NoSpace(format!(
                    "mlock of {len} bytes failed: {} (raise RLIMIT_MEMLOCK or run without --mlock)",
                    std::io::Error::last_os_error()
                )));
            }
        }
        Ok(())
    }

    /// Fault every page in now, writable, so no request pays the first
    /// touch (on a VM that is a host fault too: 12 µs a page measured here).
    fn populate(&self, len: usize) -> StoreResult<()> {
        // SAFETY: populates our own fresh mapping; contents stay zero.
        let rc =
            unsafe { libc::madvise(self.base.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) };
        if rc != 0 {
            return Err(StoreError::NoSpace(format!(
                "cannot fault in {len} bytes up front: {} (run without --prealloc)",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    fn len_bytes(&self) -> usize {
        self.pages as usize * PAGE_SIZE
    }

    /// Pointer to the first byte of `page`. Callers have bounds-checked it.
    fn page_ptr(&self, page: u64) -> *mut u8 {
        debug_assert!(page < self.pages);
        // SAFETY: page < self.pages, so the offset is inside the mapping.
        unsafe { self.base.as_ptr().add(page as usize * PAGE_SIZE) }
    }
}

impl PageStore for RamStore {
    fn info(&self) -> StoreInfo {
        let caps = Caps { durable: false, discard_frees: true, fast: true, checked: false };
        StoreInfo { pages: self.pages, caps, name: "ram".into() }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        for op in ops.iter_mut() {
            for (i, chunk) in op.buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let page = op.page + i as u64;
                let _guard = self.stripes.read_page(page);
                // SAFETY: the page is inside the mapping (checked above), the
                // stripe lock excludes writers, and `chunk` is PAGE_SIZE bytes
                // of caller memory that cannot overlap our private mapping.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.page_ptr(page),
                        chunk.as_mut_ptr(),
                        PAGE_SIZE,
                    )
                };
            }
        }
        Ok(())
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        for op in ops {
            for (i, chunk) in op.data.chunks_exact(PAGE_SIZE).enumerate() {
                let page = op.page + i as u64;
                let _guard = self.stripes.write_page(page);
                // SAFETY: in bounds (checked above), exclusive under the
                // stripe's write lock, and the source cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.page_ptr(page), PAGE_SIZE)
                };
            }
        }
        Ok(())
    }

    fn in_place(&self, page: u64, count: u64) -> Option<StoreResult<InPlace>> {
        if let Err(e) = check_range(self.pages, page, count) {
            return Some(Err(e));
        }
        let len = count as usize * PAGE_SIZE;
        // page_ptr wants a page inside; an empty run lends nothing at `base`.
        let ptr = if count == 0 { self.base.as_ptr() } else { self.page_ptr(page) };
        Some(Ok(InPlace { ptr, len }))
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        if count == 0 {
            return Ok(());
        }
        let _guards = self.stripes.write(&LockSet::of_run(page, count));
        // SAFETY: the range is inside our private anonymous mapping and no
        // reader or writer can be inside it (all its stripes are held).
        // MADV_DONTNEED on such a mapping frees the pages; they read as zero.
        let rc = unsafe {
            libc::madvise(
                self.page_ptr(page).cast(),
                count as usize * PAGE_SIZE,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(StoreError::Io(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        Ok(())
    }
}

impl Drop for RamStore {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and no borrow of it outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len_bytes()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_of(byte: u8) -> Vec<u8> {
        vec![byte; PAGE_SIZE]
    }

    #[test]
    fn unwritten_pages_read_zero_and_writes_read_back() {
        let s = RamStore::new(16, RamOptions::default()).unwrap();
        let mut buf = page_of(0xff);
        s.read(&mut [ReadOp { page: 3, buf: &mut buf }]).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        s.write(&[WriteOp { page: 3, data: &page_of(7) }]).unwrap();
        s.read(&mut [ReadOp { page: 3, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page_of(7));
    }

    /// Pages of the store's mapping that are in RAM, by mincore.
    fn resident(s: &RamStore) -> usize {
        let mut vec = vec![0u8; s.pages as usize];
        // SAFETY: the store's own mapping, page-aligned; `vec` has one byte a page.
        let rc = unsafe { libc::mincore(s.base.as_ptr().cast(), s.len_bytes(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn prealloc_faults_every_page_in_and_sparse_none() {
        let pages = 1024;
        let pre = RamStore::new(pages, RamOptions { prealloc: true, mlock: false }).unwrap();
        assert_eq!(resident(&pre), pages as usize);
        let sparse = RamStore::new(pages, RamOptions::default()).unwrap();
        assert_eq!(resident(&sparse), 0);
        sparse.write(&[WriteOp { page: 5, data: &page_of(3) }]).unwrap();
        assert_eq!(resident(&sparse), 1);
    }

    #[test]
    fn discard_reads_back_zero() {
        let s = RamStore::new(4096, RamOptions::default()).unwrap();
        let data = page_of(9).repeat(2048);
        s.write(&[WriteOp { page: 1024, data: &data }]).unwrap();
        s.discard(1025, 2000).unwrap();
        let mut buf = vec![1u8; PAGE_SIZE * 2048];
        s.read(&mut [ReadOp { page: 1024, buf: &mut buf }]).unwrap();
        assert_eq!(&buf[..PAGE_SIZE], &page_of(9)[..]);
        assert!(buf[PAGE_SIZE..2001 * PAGE_SIZE].iter().all(|&b| b == 0));
        assert_eq!(&buf[2001 * PAGE_SIZE..], &data[2001 * PAGE_SIZE..]);
    }

    #[test]
    fn out_of_range_is_refused_and_changes_nothing() {
        let s = RamStore::new(8, RamOptions::default()).unwrap();
        let data = page_of(1).repeat(2);
        // The first run is valid, the second is not: nothing is written.
        let err = s.write(&[WriteOp { page: 0, data: &data }, WriteOp { page: 7, data: &data }]);
        assert!(matches!(err, Err(StoreError::OutOfRange { .. })));
        let mut buf = page_of(0xee);
        s.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert!(s.discard(u64::MAX, 2).is_err());
        assert!(matches!(
            s.read(&mut [ReadOp { page: 0, buf: &mut [0u8; 100] }]),
            Err(StoreError::Misaligned { .. })
        ));
    }
}
