//! Before a fork of a region whose pages do not all fit its budget: every
//! `Dirty` page is written to the store and mapped back `Clean`, so that
//! the child can drop every page it shares and read them all through its
//! parent ("Forked children" in DESIGN.md).
//!
//! Why: a page the fork shares stays in memory as long as either process
//! maps it. The parent evicts (and the child keeps) what the budget has no
//! room for, so a shared page the parent evicts frees nothing; under a
//! binding memory limit that doubled the resident set and redis was
//! OOM-killed during BGSAVE. A child that drops its shared pages holds only
//! its own budget, but it may drop only pages whose bytes at the fork the
//! store keeps: `Clean` and `InStore` ones.
//!
//! How: runs of `Dirty` pages move into a staging half (UFFDIO_MOVE, which
//! takes a page only if it is there, so the handler never reads an unmapped
//! page of its own region), are written in one store call, and are copied
//! back write-protected. A page that cannot move (gone, or still shared by
//! an older fork) or whose write fails stays `Dirty`, and the child keeps
//! sharing it. A thread touching a page while it is out faults and waits
//! for the handler, which serves it once the fork is done (the page is
//! mapped again by then).

use crate::evict::Eviction;
use crate::shared::Core;
use crate::state::PageState;
use crate::stats::Counters;
use crate::uffd::resolve;
use memlend_store::PAGE_SIZE;

/// Pages cleaned at a time, two chunks in flight. A page copied back is a
/// new page while its staging copy lives, so this bounds what cleaning adds
/// to the process's memory (256 KiB): under a binding limit a whole staging
/// half (up to 4 MiB) got the process OOM-killed at the fork.
const CLEAN_CHUNK_PAGES: usize = 32;

impl Eviction {
    /// Clean every `Dirty` page that can be, `CLEAN_CHUNK_PAGES` at a time,
    /// one chunk written by the write-back thread while the next moves out
    /// (two in flight: at most twice `CLEAN_CHUNK_PAGES` pages held twice).
    /// Every write-back must be settled (`settle_all`) first.
    pub(crate) fn clean_for_fork(&mut self, core: &mut Core) {
        debug_assert!(!self.writer.any_busy(), "write-backs settle before a fork's clean");
        let dirty: Vec<u32> =
            (0..core.pages).filter(|&p| core.table.get(p) == PageState::Dirty).collect();
        let chunk_pages = CLEAN_CHUNK_PAGES.min(self.batch.max());
        // Bounded: each turn takes up to `chunk_pages` of the list.
        for chunk in dirty.chunks(chunk_pages) {
            let half =
                self.writer.free_half().expect("a chunk is staged with one at most in flight");
            let staged = self.move_out_runs(core, chunk, half * self.batch.max());
            let pool_staged = vec![false; staged.len()];
            let job = crate::writeback::Job { half, staged, clean: Vec::new(), pool_staged };
            self.writer.send(job);
            if self.writer.free_half().is_none() {
                self.finish_clean_chunk(core); // the older chunk
            }
        }
        while self.writer.any_busy() {
            self.finish_clean_chunk(core);
        }
    }

    /// Wait for the oldest chunk's write (jobs finish in order), map its
    /// pages back, and empty its half of staging.
    fn finish_clean_chunk(&mut self, core: &mut Core) {
        let Some(done) = self.writer.wait() else { return };
        if let Err(e) = &done.result {
            tracing::error!(
                "fault handler: writing {} pages for a fork failed, the child shares them: {e}",
                done.staged.len()
            );
        }
        for &(slot, page) in &done.staged {
            self.map_back_after_clean(core, slot, page, done.result.is_ok());
        }
        let first_byte = done.half * self.batch.max() * PAGE_SIZE;
        let used_bytes = CLEAN_CHUNK_PAGES.min(self.batch.max()) * PAGE_SIZE;
        if let Err(e) = self.staging.discard(first_byte, used_bytes) {
            tracing::error!("fault handler: clearing staging after a fork's clean: {e}");
        }
    }

    /// Evict until the mapped pages fit the budget, waiting for every
    /// write-back. At most one batch per page mapped.
    pub(crate) fn evict_down_to_budget(&mut self, core: &mut Core) {
        let turns_max = core.table.resident();
        for _ in 0..turns_max {
            if core.table.resident() <= core.mapped_budget() {
                break;
            }
            let before = core.table.resident();
            self.evict_batch(core);
            if core.table.resident() >= before {
                break; // nothing could go: the victims stayed
            }
        }
        self.settle_all(core);
        core.publish_resident();
    }

    /// Move the runs of `pages` that are there into staging from
    /// `first_slot`; returns (slot, page) for each page moved.
    fn move_out_runs(&self, core: &Core, pages: &[u32], first_slot: usize) -> Vec<(usize, u32)> {
        let mut staged = Vec::with_capacity(pages.len());
        let mut i = 0;
        // Bounded: each turn moves past at least one page.
        while i < pages.len() {
            let run = 1 + pages[i..].windows(2).take_while(|w| w[1] == w[0] + 1).count();
            let slot = first_slot + staged.len();
            let src = core.page_addr(pages[i]);
            let dst = self.staging.addr() + slot * PAGE_SIZE;
            let (moved_bytes, result) = core.staging_uffd.move_run(dst, src, run * PAGE_SIZE);
            let moved = match result {
                Ok(()) => run,
                Err(_) => crate::moveout::really_moved(dst, src, run, moved_bytes / PAGE_SIZE),
            };
            staged.extend((0..moved).map(|j| (slot + j, pages[i + j])));
            // A page that did not move (gone, or shared) is skipped.
            i += moved.max(1);
        }
        staged
    }

    /// Map a moved page back: write-protected and `Clean` if its write went
    /// through, else writable and still `Dirty`. One written but not mapped
    /// back (the copy needs a page, and the process may be at its memory
    /// limit) is in the store: it is `InStore`, as if evicted.
    fn map_back_after_clean(&self, core: &mut Core, slot: usize, page: u32, written: bool) {
        match self.copy_back(core, slot, page, written) {
            Ok(()) if written => {
                core.table.cleaned(page);
                Counters::add(&core.counters.pages_cleaned_for_fork, 1);
            }
            Ok(()) => {}
            Err(e) if written => {
                tracing::warn!("fault handler: page {page} written for a fork stays out: {e}");
                core.table.forget(page);
                core.table.evicted(page);
            }
            Err(e) => {
                tracing::error!("fault handler: page {page} lost, cannot map it back: {e}");
                core.table.forget(page);
                let page_addr = core.page_addr(page);
                let _ = resolve(&core.uffd, page_addr, || core.uffd.poison(page_addr, PAGE_SIZE));
            }
        }
    }
}
