//! `ram`: pages in an anonymous mapping of this process.
//!
//! Sparse by default: the mapping is reserved with `MAP_NORESERVE` and
//! transparent huge pages are off, so resident memory grows by 4 KiB per page
//! actually written and shrinks again on `discard` (`MADV_DONTNEED`). Reads of
//! untouched pages map the kernel's shared zero page and cost no memory.
//! Metadata is a fixed table of stripe locks, independent of the size.
//!
//! Allocation (for NBD block status) is the kernel's: a page that is
//! neither in RAM (`mincore`) nor swapped out (`/proc/self/pagemap`) was
//! never written or was discarded, so it reads as zero and holds nothing.

use crate::page_locks::{LockSet, PageLocks};
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use crate::{InPlace, WriteOp, PAGE_SIZE};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::OnceLock;

/// Pages whose residency is asked of the kernel at a time: bounds the
/// mincore vector (on the stack) and the pagemap entries read at once.
const RESIDENCY_CHUNK_PAGES: usize = 4096;
/// Bytes of one `/proc/self/pagemap` entry, and the bits of it used here
/// (`Documentation/admin-guide/mm/pagemap.rst`).
const PAGEMAP_ENTRY_BYTES: usize = 8;
const PAGEMAP_SWAPPED: u64 = 1 << 62;
const PAGEMAP_PRESENT: u64 = 1 << 63;

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
    /// Written pages may be swapped out (not mlocked), so a page not in
    /// RAM is not necessarily a hole.
    swappable: bool,
    /// The kernel's pages are this store's pages, so mincore and pagemap
    /// speak of one store page per entry. Without it, allocation is unknown.
    host_pages_match: bool,
    /// `/proc/self/pagemap`, opened on first use; None if it cannot be.
    pagemap: OnceLock<Option<File>>,
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
        // SAFETY: sysconf only reads a system constant.
        let host_page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let store = RamStore {
            base,
            pages,
            stripes: PageLocks::new(),
            swappable: !opts.mlock,
            host_pages_match: host_page_bytes == PAGE_SIZE as libc::c_long,
            pagemap: OnceLock::new(),
        };
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

    /// Which pages of `page..page + resident.len()` are in RAM, by mincore:
    /// bit 0 of each byte. Callers have bounds-checked the range.
    fn resident(&self, page: u64, resident: &mut [u8]) -> StoreResult<()> {
        // SAFETY: the range is inside our mapping and starts page-aligned;
        // mincore writes one byte per page into `resident`, which has them.
        let rc = unsafe {
            libc::mincore(
                self.page_ptr(page).cast(),
                resident.len() * PAGE_SIZE,
                resident.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(StoreError::Io(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The pagemap entries of `page..page + n` into `entries`; None if
    /// `/proc/self/pagemap` cannot be read (no procfs, or a kernel without it).
    fn pagemap_entries(&self, page: u64, n: usize, entries: &mut Vec<u64>) -> Option<()> {
        let file = self.pagemap.get_or_init(|| File::open("/proc/self/pagemap").ok()).as_ref()?;
        let first_entry = self.page_ptr(page) as u64 / PAGE_SIZE as u64;
        let mut raw = vec![0u8; n * PAGEMAP_ENTRY_BYTES];
        file.read_exact_at(&mut raw, first_entry * PAGEMAP_ENTRY_BYTES as u64).ok()?;
        entries.clear();
        entries.extend(
            raw.chunks_exact(PAGEMAP_ENTRY_BYTES)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("chunks of 8"))),
        );
        Some(())
    }

    /// Append the allocation of `page..page + n` (n up to a chunk) to `out`.
    /// None if a page out of RAM may be swapped and pagemap cannot say.
    fn allocation_chunk(
        &self,
        page: u64,
        n: usize,
        entries: &mut Vec<u64>,
        out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        let mut resident = [0u8; RESIDENCY_CHUNK_PAGES];
        let resident = &mut resident[..n];
        if let Err(e) = self.resident(page, resident) {
            return Some(Err(e));
        }
        // Pages swapped out are data mincore does not see; pagemap does.
        let all_in = resident.iter().all(|&r| r & 1 != 0);
        let swapped = if self.swappable && !all_in {
            self.pagemap_entries(page, n, entries)?;
            Some(&entries[..])
        } else {
            None
        };
        for (i, &r) in resident.iter().enumerate() {
            push_run(out, 1, holds_data(r, swapped.map(|e| e[i])));
        }
        Some(Ok(()))
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

    /// From the kernel's page tables. A page only ever read maps the
    /// kernel's shared zero page, which counts as resident: it is reported
    /// as data, which is correct if less precise.
    fn allocation(
        &self,
        page: u64,
        count: u64,
        out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        if let Err(e) = check_range(self.pages, page, count) {
            return Some(Err(e));
        }
        if !self.host_pages_match {
            return None;
        }
        out.clear();
        let mut entries = Vec::new();
        let end = page + count;
        let mut at = page;
        while at < end {
            let n = (end - at).min(RESIDENCY_CHUNK_PAGES as u64) as usize;
            match self.allocation_chunk(at, n, &mut entries, out) {
                Some(Ok(())) => at += n as u64,
                other => {
                    out.clear();
                    return other;
                }
            }
        }
        Some(Ok(()))
    }
}

/// Whether a page holds data, from its mincore byte and, when the page
/// may be swapped, its pagemap entry: in RAM, or swapped out.
fn holds_data(resident: u8, pagemap: Option<u64>) -> bool {
    resident & 1 != 0 || pagemap.is_some_and(|e| e & (PAGEMAP_SWAPPED | PAGEMAP_PRESENT) != 0)
}

/// Append `pages` pages to `runs`, merging with the last run if alike.
fn push_run(runs: &mut Vec<(u64, bool)>, pages: u64, allocated: bool) {
    match runs.last_mut() {
        Some((n, a)) if *a == allocated => *n += pages,
        _ => runs.push((pages, allocated)),
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

    fn allocation(s: &RamStore, page: u64, count: u64) -> Vec<(u64, bool)> {
        let mut runs = vec![(99, true)]; // replaced, not appended to
        s.allocation(page, count, &mut runs).expect("ram knows its allocation").unwrap();
        runs
    }

    #[test]
    fn allocation_follows_writes_and_discards() {
        let s = RamStore::new(64, RamOptions::default()).unwrap();
        assert_eq!(allocation(&s, 0, 64), [(64, false)]);
        s.write(&[WriteOp { page: 3, data: &page_of(1).repeat(2) }]).unwrap();
        s.write(&[WriteOp { page: 10, data: &page_of(0) }]).unwrap();
        s.discard(4, 1).unwrap();
        assert_eq!(
            allocation(&s, 0, 64),
            [(3, false), (1, true), (6, false), (1, true), (53, false)]
        );
        assert_eq!(allocation(&s, 3, 2), [(1, true), (1, false)]);
        assert_eq!(allocation(&s, 64, 0), []);
        let mut runs = Vec::new();
        assert!(matches!(s.allocation(60, 5, &mut runs), Some(Err(StoreError::OutOfRange { .. }))));
    }

    #[test]
    fn allocation_runs_merge_across_chunks_and_read_pages_count_as_data() {
        let pages = 3 * RESIDENCY_CHUNK_PAGES as u64;
        let s = RamStore::new(pages, RamOptions::default()).unwrap();
        let at = RESIDENCY_CHUNK_PAGES as u64 - 2;
        s.write(&[WriteOp { page: at, data: &page_of(5).repeat(4) }]).unwrap();
        let rest = pages - at - 4;
        assert_eq!(allocation(&s, 0, pages), [(at, false), (4, true), (rest, false)]);
        // A read maps the zero page: reported as data, never as a hole.
        // The bytes read are checked: a read whose result went unused was
        // once optimised away with the load behind it, and nothing mapped.
        let mut buf = page_of(7);
        s.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page_of(0));
        assert_eq!(allocation(&s, 0, 2), [(1, true), (1, false)]);
        let prealloc = RamStore::new(16, RamOptions { prealloc: true, mlock: false }).unwrap();
        assert_eq!(allocation(&prealloc, 0, 16), [(16, true)]);
    }

    #[test]
    fn swapped_pages_hold_data() {
        assert!(holds_data(1, None));
        assert!(!holds_data(0, None));
        assert!(!holds_data(0, Some(0)));
        assert!(holds_data(0, Some(PAGEMAP_SWAPPED)));
        assert!(holds_data(0, Some(PAGEMAP_PRESENT)));
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
