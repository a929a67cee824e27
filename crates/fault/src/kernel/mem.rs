//! The mmap edge: an anonymous private mapping, its `madvise` calls and its
//! unmapping. Nothing else in the crate calls mmap, madvise or munmap.

use memlend_store::PAGE_SIZE;
use std::io;

/// An anonymous, private, unreserved mapping of whole pages, unmapped on drop.
pub struct Mapping {
    addr: usize,
    len_bytes: usize,
}

impl Mapping {
    /// Map `pages` pages of anonymous memory with no swap reservation and no
    /// transparent huge pages (the handler maps and evicts 4 KiB at a time).
    pub fn new(pages: usize) -> io::Result<Mapping> {
        let len_bytes = pages
            .checked_mul(PAGE_SIZE)
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing cannot alias any memory we already use.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len_bytes, prot, flags, -1, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping { addr: ptr as usize, len_bytes };
        map.advise(0, len_bytes, libc::MADV_NOHUGEPAGE)?;
        Ok(map)
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Drop the pages at `offset..offset + len_bytes`; on a registered range
    /// the next touch faults to the handler again.
    pub fn discard(&self, offset: usize, len_bytes: usize) -> io::Result<()> {
        self.advise(offset, len_bytes, libc::MADV_DONTNEED)
    }

    /// The bytes of pages `first..first + count`. The caller must know these
    /// pages are present (mapped by the handler itself), or reading them would
    /// fault to the very thread that is reading.
    pub fn present_pages(&self, first: usize, count: usize) -> &[u8] {
        let offset = first * PAGE_SIZE;
        let len_bytes = count * PAGE_SIZE;
        assert!(offset + len_bytes <= self.len_bytes, "pages outside mapping");
        // SAFETY: the range lies inside our live mapping (checked above), and
        // the mapping is readable. Only the fault handler and its write-back
        // thread read staging through this view. The handler changes a page
        // only through the kernel (UFFDIO_MOVE in, MADV_DONTNEED out), and
        // only in a staging half that no write-back job holds, so no slice
        // handed to the write-back thread sees its bytes change.
        unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, len_bytes) }
    }

    fn advise(&self, offset: usize, len_bytes: usize, advice: i32) -> io::Result<()> {
        assert!(offset + len_bytes <= self.len_bytes, "advice outside mapping");
        // SAFETY: the range lies inside our own mapping (checked above);
        // MADV_DONTNEED and MADV_NOHUGEPAGE change residency, never validity.
        let rc = unsafe { libc::madvise((self.addr + offset) as *mut _, len_bytes, advice) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Collapse `addr..addr + len_bytes` (one aligned huge page of the region)
/// into a huge page: allow huge pages there, collapse, and forbid them
/// again so that the kernel's own khugepaged never collapses region pages
/// while the handler evicts (`huge.rs`).
pub(crate) fn collapse_huge(addr: usize, len_bytes: usize) -> io::Result<()> {
    let advise = |advice: i32| {
        // SAFETY: the range is a chunk of the region's mapping, which stays
        // mapped until the collapsing thread is joined (`huge::Huge`'s drop
        // runs when the handler ends, before `Region` unmaps). These advices
        // change how pages are mapped, never their contents.
        // The system call itself, not libc's `madvise`: in a program run
        // under the preload shim that symbol is the shim's, which ignores
        // huge-page advice on far memory (the program's own advice).
        let rc = unsafe { libc::syscall(libc::SYS_madvise, addr, len_bytes, advice) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    advise(libc::MADV_HUGEPAGE)?;
    let collapsed = advise(libc::MADV_COLLAPSE);
    advise(libc::MADV_NOHUGEPAGE)?;
    collapsed
}

/// Page-aligned bytes of the handler's own, never registered with
/// userfaultfd: buffers for store I/O. Aligned, so an O_DIRECT store reads
/// into them with no bounce copy; mapped, so they never grow a malloc arena
/// (a `Vec` per prefetch window did, by megabytes).
pub struct PageBuf {
    map: Mapping,
    /// The most pages its users said they filled (`PageBuf::filling`):
    /// nothing gives them back, so they stay resident.
    filled_pages: usize,
}

impl PageBuf {
    pub fn new(pages: usize) -> io::Result<PageBuf> {
        Ok(PageBuf { map: Mapping::new(pages)?, filled_pages: 0 })
    }

    /// The first `pages` are about to be filled: how many more pages that
    /// makes resident than ever before.
    pub fn filling(&mut self, pages: usize) -> usize {
        let grew = pages.saturating_sub(self.filled_pages);
        self.filled_pages += grew;
        grew
    }

    pub fn bytes(&self, len_bytes: usize) -> &[u8] {
        assert!(len_bytes <= self.map.len_bytes, "past the buffer");
        // SAFETY: inside our live, readable mapping; it is registered with
        // no userfaultfd, so a touch never waits on a handler.
        unsafe { std::slice::from_raw_parts(self.map.addr as *const u8, len_bytes) }
    }

    /// Give back the memory of `offset..offset + len_bytes`; it reads as
    /// zero after.
    pub fn discard(&self, offset: usize, len_bytes: usize) -> io::Result<()> {
        self.map.discard(offset, len_bytes)
    }

    pub fn bytes_mut(&mut self, len_bytes: usize) -> &mut [u8] {
        assert!(len_bytes <= self.map.len_bytes, "past the buffer");
        // SAFETY: as in `bytes`; `&mut self` makes this the only view, since
        // nothing else knows the mapping's address.
        unsafe { std::slice::from_raw_parts_mut(self.map.addr as *mut u8, len_bytes) }
    }
}

/// Which of the `pages` pages from `addr` (page-aligned, inside one of our
/// mappings) are mapped, into `out`: mincore(2), which for anonymous memory
/// reports a present page-table entry. It reads page tables only, so it
/// never faults a page in or waits on a handler.
pub fn mapped_pages(addr: usize, pages: usize, out: &mut Vec<bool>) -> io::Result<()> {
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore writes one byte per page of the range into `vec`,
    // which holds `pages` bytes; it reads no memory of the range itself.
    let rc = unsafe { libc::mincore(addr as *mut _, pages * PAGE_SIZE, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    out.clear();
    out.extend(vec.iter().map(|&b| b & 1 == 1));
    Ok(())
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nothing borrows it any
        // more: `present_pages` borrows `self`, and the region's owner
        // promises no access through its raw pointer after drop.
        unsafe { libc::munmap(self.addr as *mut _, self.len_bytes) };
    }
}
