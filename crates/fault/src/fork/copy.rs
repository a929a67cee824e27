//! A forked child's page answered from its parent's own memory, where that
//! still holds the page as it was at the fork.
//!
//! Why: a `BGSAVE` child reads its pages through the parent several times
//! over (its budget is a sixteenth of the parent's), and in one run 57% of
//! those reads were of pages the parent had mapped (512 K of 902 K). Read
//! from the store, each costs a round trip to a donor; copied, a microsecond.
//!
//! When a copy is the fork's bytes: a page the kernel shows mapped and
//! write-protected by userfaultfd (`/proc/self/pagemap`) has not been
//! written since it was protected, because the first write raises a WP
//! fault and the handler lifts the protection before the write goes on.
//! The handler protects a page only (a) when it maps the store's bytes (a
//! read fault, prefetch, the compressed pool, whose copies are the store's)
//! or (b) at a pause (a fork's clean). So if no pause was asked for since
//! this child's, a mapped, protected page holds the store's bytes; and if
//! the snapshot kept no old bytes for it (the caller's `unchanged`), the
//! store's copy is the fork's. Both are looked at again after the copy: a
//! write, eviction, discard or pause that raced it shows in one of them,
//! and the caller then reads the page from the snapshot as before.
//!
//! The copy itself may fault, if eviction moved the page out after the
//! first look: the handler then maps it from the store, and the second
//! look decides as above. The caller holds no lock the handler takes.

use crate::fork::pause::Pause;
use memlend_store::PAGE_SIZE;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{fence, Ordering::SeqCst};
use std::sync::Arc;

/// pagemap: the page is present in memory.
const PRESENT: u64 = 1 << 63;
/// pagemap: its entry is write-protected by userfaultfd.
const UFFD_WP: u64 = 1 << 57;

/// Copies of the parent's own pages for one fork's child.
pub struct ParentCopy {
    pagemap: File,
    base: usize,
    pages: u32,
    pause: Arc<Pause>,
    /// The pause of this child's fork (`Paused::number`).
    number: u64,
}

impl ParentCopy {
    pub(crate) fn new(base: usize, pages: u32, pause: Arc<Pause>, number: u64) -> io::Result<Self> {
        let pagemap = File::open("/proc/self/pagemap")?;
        Ok(ParentCopy { pagemap, base, pages, pause, number })
    }

    /// Copy page `page` into `buf` (one page) if this process's copy is
    /// the fork's: whether it did. `unchanged` says whether the store's copy
    /// is still the fork's (the snapshot kept nothing for it); it is asked
    /// after the copy. Errors are the pagemap's; `buf` is then unspecified.
    pub fn copy(
        &self,
        page: u32,
        buf: &mut [u8],
        unchanged: impl FnOnce() -> bool,
    ) -> io::Result<bool> {
        assert!(buf.len() == PAGE_SIZE && page < self.pages, "one page of the region");
        if !self.untouched(page)? {
            return Ok(false);
        }
        let src = (self.base + page as usize * PAGE_SIZE) as *const u64;
        for (i, word) in buf.chunks_exact_mut(8).enumerate() {
            // SAFETY: the page lies inside the region, which stays mapped
            // while the process runs (the preload shim never drops it). A
            // volatile read, since another thread may write the page once
            // the handler lifts its protection: such bytes are thrown away
            // below. An unmapped page faults, and the handler maps it.
            let value = unsafe { std::ptr::read_volatile(src.add(i)) };
            word.copy_from_slice(&value.to_ne_bytes());
        }
        fence(SeqCst);
        Ok(self.untouched(page)? && unchanged())
    }

    /// No pause since this child's, and the page mapped and protected.
    fn untouched(&self, page: u32) -> io::Result<bool> {
        if self.pause.asked_count() != self.number {
            return Ok(false);
        }
        let mut entry = [0u8; 8];
        let vpn = (self.base / PAGE_SIZE) as u64 + u64::from(page);
        self.pagemap.read_exact_at(&mut entry, vpn * 8)?;
        let entry = u64::from_ne_bytes(entry);
        Ok(entry & PRESENT != 0 && entry & UFFD_WP != 0 && self.pause.asked_count() == self.number)
    }
}
