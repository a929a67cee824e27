//! Moving victims out of the region into a staging half (UFFDIO_MOVE), and
//! what to believe when a move stops part-way.
//!
//! A move that stops part-way says how many pages it moved; eviction trusts
//! that count to know which slot holds which page. far_micro's SSD scan
//! (2026-11-25, kernel 6.18) logged moves that found their slot already
//! taken (EEXIST), which nothing we know of explains. Were a page ever to
//! leave the region uncounted, its slot would be cleared with the half and
//! the page would read zeros. So after any failed move we look (mincore) at
//! where the run's pages really are, and go by that.

use crate::evict::Eviction;
use crate::kernel::mem::mapped_pages;
use crate::kernel::uffd::retry_eagain;
use crate::shared::Core;
use memlend_store::PAGE_SIZE;
use std::sync::atomic::Ordering::SeqCst;

impl Eviction {
    /// Move each victim into the next staging slot from `first_slot`.
    /// Victims that moved are gathered at the front of `victims`, in slot
    /// order; returns how many. Runs of consecutive pages move in one call
    /// (a sequential scan evicts in runs): per-page calls cost the handler
    /// a fifth of its time on a scan.
    pub(crate) fn stage(
        &mut self,
        core: &mut Core,
        victims: &mut [u32],
        first_slot: usize,
    ) -> usize {
        let mut staged = 0;
        let mut i = 0;
        while i < victims.len() {
            let run = 1 + victims[i..].windows(2).take_while(|w| w[1] == w[0] + 1).count();
            let src = core.base + victims[i] as usize * PAGE_SIZE;
            let dst = self.staging.addr() + (first_slot + staged) * PAGE_SIZE;
            let (moved_bytes, result) = core.staging_uffd.move_run(dst, src, run * PAGE_SIZE);
            let moved = match result {
                Ok(()) => run,
                Err(_) => really_moved(dst, src, run, moved_bytes / PAGE_SIZE),
            };
            // In place: `staged <= i`, so no victim is overwritten unread.
            victims.copy_within(i..i + moved, staged);
            staged += moved;
            i += moved;
            if moved > 0 {
                // Done, or stopped part-way: the next run starts at the stop.
                continue;
            }
            if self.stage_one(core, victims[i], first_slot + staged) {
                victims[staged] = victims[i];
                staged += 1;
            }
            i += 1;
        }
        staged
    }

    /// Move one victim that a run move stopped at, into `slot`: whether it
    /// moved. A page gone (MADV_DONTNEED by the owner) is `Empty`; one that
    /// cannot move stays resident and goes back in the queue.
    fn stage_one(&mut self, core: &mut Core, page: u32, slot: usize) -> bool {
        let src = core.base + page as usize * PAGE_SIZE;
        let dst = self.staging.addr() + slot * PAGE_SIZE;
        match retry_eagain(|| core.staging_uffd.move_pages(dst, src, PAGE_SIZE)) {
            Ok(()) => true,
            Err(_) if really_moved(dst, src, 1, 0) == 1 => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                core.table.emptied(page);
                false
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && make_exclusive(core, page) => {
                match retry_eagain(|| core.staging_uffd.move_pages(dst, src, PAGE_SIZE)) {
                    Ok(()) => true,
                    Err(_) if really_moved(dst, src, 1, 0) == 1 => true,
                    Err(e) => {
                        tracing::warn!("fault handler: page {page} still cannot move out once unshared, kept: {e}");
                        core.table.requeue(page);
                        false
                    }
                }
            }
            Err(e) => {
                // EINVAL: the owner gave the page a protection other than
                // read-write (mprotect to read-only, or executable code):
                // UFFDIO_MOVE wants staging's. It stays, and is tried again
                // when it comes round; said once, not at every batch.
                if !self.unmovable_said {
                    self.unmovable_said = true;
                    tracing::warn!(
                        "fault handler: page {page} cannot move out, kept: {e} (said once; \
                         pages the program made read-only or executable stay resident)"
                    );
                }
                core.table.requeue(page);
                false
            }
        }
    }
}

/// A page UFFDIO_MOVE refuses (EBUSY) because a fork shared it (it is
/// not anon-exclusive, even once the child is gone): write to it, so the
/// kernel gives this process a page of its own (or takes the shared one
/// back, if no one else maps it), and it can move. A `Clean` page is
/// unprotected first and counted `Dirty` from then on, since a write the
/// program makes after the unprotect is not seen. Whether it was done.
fn make_exclusive(core: &mut Core, page: u32) -> bool {
    let addr = core.base + page as usize * PAGE_SIZE;
    let mut present = Vec::new();
    // The write below must not raise a userfault: this thread serves them.
    // (A copy-on-write fault is the kernel's, and is what we want.) A page mapped now stays mapped while the handler reads no
    // events (a zap waits for its REMOVE or UNMAP to be read); the shim
    // turns MADV_FREE on far memory into a discard, so no page is reclaimed
    // without an event.
    if mapped_pages(addr, 1, &mut present).is_err() || !present[0] {
        return false;
    }
    if core.table.get(page) == crate::state::PageState::Clean {
        if let Err(e) = core.uffd.unprotect(addr, PAGE_SIZE) {
            tracing::warn!("fault handler: unprotecting shared page {page}: {e}");
            return false;
        }
        core.table.dirtied(page);
    }
    // SAFETY: the page is mapped read-write in this process (checked just
    // above, and no event that could unmap it is read meanwhile).
    let byte = unsafe { &*(addr as *const std::sync::atomic::AtomicU8) };
    if !write_same(byte) {
        return false;
    }
    crate::stats::Counters::add(&core.counters.pages_unshared, 1);
    true
}

/// Tries at writing a byte back as it was while the program changes it.
const WRITE_SAME_TRIES: usize = 64;

/// Write `byte` back as it is, so that its page is written to. A compare
/// and swap of the value just read: an atomic add of zero would not do, as
/// the compiler makes an idempotent one a plain fenced load, which writes
/// nothing. A swap that fails (the program wrote the byte meanwhile) is
/// tried again, never more than `WRITE_SAME_TRIES` times.
fn write_same(byte: &std::sync::atomic::AtomicU8) -> bool {
    (0..WRITE_SAME_TRIES).any(|_| {
        let now = byte.load(SeqCst);
        byte.compare_exchange(now, std::hint::black_box(now), SeqCst, SeqCst).is_ok()
    })
}

/// After a move of `run` pages from `src` to `dst` failed, how many of the
/// first pages really moved: gone from the region and mapped in staging.
/// Logged when that is not the `reported` count. If the pages cannot be
/// looked at, the report stands.
pub(crate) fn really_moved(dst: usize, src: usize, run: usize, reported: usize) -> usize {
    let (mut in_region, mut in_staging) = (Vec::new(), Vec::new());
    let looked = mapped_pages(src, run, &mut in_region)
        .and_then(|()| mapped_pages(dst, run, &mut in_staging));
    if let Err(e) = looked {
        tracing::warn!("fault handler: cannot check a failed move ({e}); trusting its count");
        return reported;
    }
    let found = (0..run).take_while(|&j| !in_region[j] && in_staging[j]).count();
    if found != reported {
        tracing::error!(
            "fault handler: UFFDIO_MOVE reported {reported} of {run} pages moved, but {found} did; \
             going by where they are"
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::mem::Mapping;
    use crate::kernel::uffd::tests::source_with_hole;
    use crate::kernel::uffd::Uffd;

    #[test]
    fn a_move_that_miscounts_is_corrected_by_where_the_pages_are() {
        let src = source_with_hole();
        let dst = Mapping::new(4).unwrap();
        let uffd = Uffd::open_staging().unwrap();
        uffd.register(dst.addr(), dst.len_bytes(), false).unwrap();
        let (moved, result) = uffd.move_run(dst.addr(), src.addr(), 4 * PAGE_SIZE);
        assert_eq!((moved, result.is_err()), (2 * PAGE_SIZE, true));

        let (d, s) = (dst.addr(), src.addr());
        assert_eq!(really_moved(d, s, 4, 2), 2, "a true count stands");
        assert_eq!(really_moved(d, s, 4, 1), 2, "an under-count is corrected");
        assert_eq!(really_moved(d, s, 4, 3), 2, "an over-count is corrected");
        let at = 3 * PAGE_SIZE;
        assert_eq!(really_moved(d + at, s + at, 1, 0), 0, "page 3 is still in the source");
        uffd.unregister(dst.addr(), dst.len_bytes()).unwrap();
    }

    #[test]
    fn mapped_pages_sees_present_and_absent_pages() {
        let src = source_with_hole();
        let mut mapped = Vec::new();
        mapped_pages(src.addr(), 4, &mut mapped).unwrap();
        assert_eq!(mapped, [true, true, false, true]);
        assert!(mapped_pages(src.addr() + 1, 1, &mut mapped).is_err(), "unaligned");
    }
}
