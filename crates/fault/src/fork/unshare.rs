//! Pages a fork shared, made this process's own before eviction moves
//! them out, a batch in one system call.
//!
//! Why: UFFDIO_MOVE refuses (EBUSY) a page that is not anon-exclusive, and
//! every page mapped at a fork stays so, even once the child has dropped
//! its copy, until this process writes it. Eviction used to find that out
//! page by page: a run's move failed, `really_moved` looked twice with
//! mincore, the single move failed again and looked twice more, then
//! `make_exclusive` unprotected a `Clean` page (a TLB flush), wrote a byte
//! and counted the page `Dirty`, so that a page whose store copy was
//! current was written to the store again. After redis's `BGSAVE` fork
//! that came to ~30 us a page, and the 15 K pages the budget wanted out
//! stalled redis for half a second (`bench/results/stalltrace_3.json`).
//!
//! How: a read-only pin of a page that is not exclusive makes the kernel
//! unshare it (`FAULT_FLAG_UNSHARE`: reuse the page if no one else maps
//! it, else copy it), and an unshare is not a write: the page keeps its
//! userfaultfd write protection and raises no fault for the handler.
//! `process_vm_readv` of our own pages takes such pins, up to `IOV_MAX`
//! pages a call; the bytes it copies all land on one scratch page. Measured
//! here (a throwaway C program): 0.9 us a page with the child gone, 2.2 us
//! with it still mapping them; then one UFFDIO_MOVE took 255 pages in 24 us.
//! A page the pin did not reach is left to the old way (`evict/moveout.rs`).
//!
//! Which pages: every page mapped at a pause (`mark_mapped`); a bit is
//! cleared when its page is unshared here. A bit left on a page that is
//! already exclusive costs one pin and no fault.

use crate::fork::page_bits::PageBits;
use crate::kernel::mem::mapped_pages;
use crate::shared::Core;
use crate::state::PageState;
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;

/// Pages in one `process_vm_readv` (the kernel's `IOV_MAX`).
const PIN_BATCH_PAGES: usize = 1024;

#[derive(Default)]
pub(crate) struct ForkShared {
    /// Mapped at the last fork, not unshared here since.
    pages: PageBits,
    /// Where the pinned pages' bytes are copied (and thrown away).
    scratch: Vec<u8>,
    /// `process_vm_readv` refused us (seccomp, an LSM): not tried again.
    refused: bool,
}

impl ForkShared {
    /// At a pause: every mapped page is shared with the coming child.
    pub(crate) fn mark_mapped(&mut self, pages: u32, state: impl Fn(u32) -> PageState) {
        if self.refused {
            return;
        }
        self.pages.grow_to(pages);
        for page in (0..pages).filter(|&page| state(page).is_resident()) {
            self.pages.insert(page);
        }
    }

    /// Before eviction moves `victims` out: unshare those a fork shared. A
    /// page not mapped is skipped (pinning it would raise a userfault on
    /// this, the thread that serves them); so is any page if the call fails.
    pub(crate) fn unshare_victims(&mut self, core: &Core, victims: &[u32]) {
        if self.pages.count() == 0 {
            return;
        }
        let pages: Vec<u32> = victims.iter().copied().filter(|&p| self.pages.take(p)).collect();
        if !pages.is_empty() {
            self.unshare(core, pages);
        }
    }

    fn unshare(&mut self, core: &Core, mut pages: Vec<u32>) {
        pages.sort_unstable();
        let mapped = mapped_of(core, &pages);
        // Bounded: each turn pins up to a batch of the list.
        for chunk in mapped.chunks(PIN_BATCH_PAGES) {
            match pin_read(core, &mut self.scratch, chunk) {
                Ok(n) => Counters::add(&core.counters.pages_unshared_ahead, n as u64),
                Err(e) => {
                    tracing::warn!(
                        "fault handler: unsharing pages a fork shared: {e}; moving them the slow way"
                    );
                    let errno = e.raw_os_error();
                    if errno == Some(libc::EPERM) || errno == Some(libc::ENOSYS) {
                        self.refused = true;
                        self.pages.clear();
                    }
                    return;
                }
            }
        }
    }
}

/// Those of `pages` (sorted) that are mapped, looked at a run at a time.
fn mapped_of(core: &Core, pages: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(pages.len());
    let mut present = Vec::new();
    let mut i = 0;
    // Bounded: each turn moves past one run of consecutive pages.
    while i < pages.len() {
        let run = 1 + pages[i..].windows(2).take_while(|w| w[1] == w[0] + 1).count();
        if mapped_pages(core.page_addr(pages[i]), run, &mut present).is_ok() {
            out.extend((0..run).filter(|&j| present[j]).map(|j| pages[i + j]));
        }
        i += run;
    }
    out
}

/// Pin `pages` for reading, through `process_vm_readv` of this process:
/// how many it reached.
fn pin_read(core: &Core, scratch: &mut Vec<u8>, pages: &[u32]) -> std::io::Result<usize> {
    debug_assert!(pages.len() <= PIN_BATCH_PAGES);
    scratch.resize(PAGE_SIZE, 0);
    let local: Vec<libc::iovec> = pages
        .iter()
        .map(|_| libc::iovec { iov_base: scratch.as_mut_ptr().cast(), iov_len: PAGE_SIZE })
        .collect();
    let remote: Vec<libc::iovec> = pages
        .iter()
        .map(|&p| libc::iovec { iov_base: core.page_addr(p) as *mut _, iov_len: PAGE_SIZE })
        .collect();
    // SAFETY: `local` names the scratch page only, which we own and may
    // overwrite (every entry the same page); `remote` is read, never
    // written, and names pages of our region that are mapped (checked
    // just before, and nothing unmaps them while the handler reads no
    // events), so the kernel's pins raise no userfault.
    let n = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize / PAGE_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_the_mapped_pages_once_and_takes_each_once() {
        let mut shared = ForkShared::default();
        let state =
            |p: u32| if p.is_multiple_of(3) { PageState::Clean } else { PageState::InStore };
        shared.mark_mapped(100, state);
        assert_eq!(shared.pages.count(), 34);
        shared.mark_mapped(100, state);
        assert_eq!(shared.pages.count(), 34, "a second pause marks nothing twice");
        assert!(shared.pages.take(99) && !shared.pages.take(99) && !shared.pages.take(98));
        assert_eq!(shared.pages.count(), 33);
    }
}
