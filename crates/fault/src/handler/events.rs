//! Non-cooperative events: the owner freed, discarded or unmapped region
//! memory (REMOVE, UNMAP), or moved it (REMAP, unsupported).
//!
//! REMOVE comes for MADV_DONTNEED, MADV_REMOVE and MADV_FREE alike, before
//! the kernel drops anything; the madvising thread waits until we have read
//! it. UNMAP comes after the pages are gone. Either way, a page in the range
//! holds nothing worth keeping: its store copy is discarded (so a donor
//! frees the memory) and it reads zero from now on.

use crate::handler::Handler;
use crate::state::PageState;
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;

impl Handler {
    /// `start..end` was madvised (`unmapped` false) or unmapped (true).
    pub(crate) fn removed(&mut self, start: usize, end: usize, unmapped: bool) {
        let counter = if unmapped {
            &self.core.counters.unmap_events
        } else {
            &self.core.counters.remove_events
        };
        Counters::add(counter, 1);
        let Some((first, count)) = self.pages_within(start, end) else {
            self.core.discards.settled(start, end);
            return;
        };
        // Whatever these pages hold next is not their bytes at a lazy
        // fork: its child keeps its copies (`fork/lazy.rs`).
        self.fork.forget(first, count);
        // MADV_DONTNEED (all `Region::discard` uses) and munmap drop the
        // pages for sure. Any other madvise may be MADV_FREE, which leaves a
        // page mapped, with its data, until the kernel reclaims it, and then
        // any write keeps the page: so a resident page stays counted and
        // becomes `Dirty` (its store copy is discarded below, and its
        // write-protection, if any, is lifted by the next WP fault rather than
        // leaving the writer faulting for ever). If it was dropped after all,
        // its next fault reads zero and eviction finds nothing to move.
        let dropped = unmapped || self.core.discards.is_discard(start, end);
        if dropped {
            // Pages in flight to the store are dropped too; their write
            // may still land, on copies nothing reads (they are `Empty`).
            let (table, range) = (&mut self.core.table, first..first + count);
            self.eviction.writing.retain(|&page, _| {
                let keep = !range.contains(&page);
                if !keep {
                    table.emptied(page);
                }
                keep
            });
        }
        for page in first..first + count {
            match self.core.table.get(page) {
                PageState::Clean | PageState::Dirty if !dropped => self.core.table.dirtied(page),
                _ => self.core.table.forget(page),
            }
        }
        if let Some(pool) = self.core.zpool.as_mut() {
            pool.remove_range(first, count);
        }
        // Given up by the program: a lost page there may read zero again.
        let gone: Vec<u32> = self.core.lost.range(first..first + count).copied().collect();
        gone.iter().for_each(|page| {
            self.core.lost.remove(page);
        });
        self.core.table.compact_if_stale();
        self.core.publish_resident();
        Counters::add(&self.core.counters.pages_discarded, u64::from(count));
        if let Err(e) = self.core.store.discard(u64::from(first), u64::from(count)) {
            // Best effort: the pages are `Empty` or `Dirty` now, so the
            // stale copies are never read; the store only holds them longer.
            Counters::add(&self.core.counters.store_discard_failures, 1);
            tracing::warn!("fault handler: store discard of {count} pages at {first} failed: {e}");
        }
        self.core.discards.settled(start, end);
    }

    /// mremap moved region memory: the region must not move (its pages are
    /// found by offset from the address it was created at). Pages moved away
    /// are beyond our reach; say so loudly.
    pub(crate) fn remapped(&mut self, from: usize, to: usize, len: usize) {
        tracing::error!(
            "fault handler: region memory at {from:#x} was moved to {to:#x} ({len} bytes) \
             by mremap; regions must not be moved, those pages are no longer handled"
        );
        Counters::add(&self.core.counters.remap_events, 1);
        if let Some((first, count)) = self.pages_within(from, from + len) {
            self.fork.forget(first, count);
        }
    }

    /// The region's pages inside `start..end`, as (first, count); None if
    /// none are.
    fn pages_within(&self, start: usize, end: usize) -> Option<(u32, u32)> {
        let region_end = self.core.base + self.core.pages as usize * PAGE_SIZE;
        let start = start.max(self.core.base);
        let end = end.min(region_end);
        if start >= end {
            return None;
        }
        let first = (start - self.core.base) / PAGE_SIZE;
        let last = (end - self.core.base).div_ceil(PAGE_SIZE);
        Some((first as u32, (last - first) as u32))
    }
}
