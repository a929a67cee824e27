//! Prefetch: after a missing fault is answered (its thread already woken),
//! if the recent faults show a trend, read the next window of pages along
//! it in one store call and map them (write-protected unless `intent.rs`
//! says writable), so the stream finds them mapped. Untouched pages of the
//! window are zero-filled ahead too: a stream writing fresh memory then
//! takes one fault per window instead of one per page (the kernel gives
//! each zero page its own copy on the first write, with no message to us).

use crate::handler::Handler;
use crate::state::PageState;
use crate::stats::Counters;
use crate::trend::Window;
use memlend_store::{ReadOp, PAGE_SIZE};

/// Most pages one eviction batch takes to make room for a window (1 MiB).
const WINDOW_BATCH_PAGES: usize = 256;

/// Windows of at least this many pages leave their middle page unmapped.
const MARKER_MIN_PAGES: usize = 16;

impl Handler {
    /// Called after a missing fault on `page` was resolved.
    pub(crate) fn after_fault(&mut self, page: u32) {
        let Some(advice) = self.trend.fault(page) else {
            return;
        };
        if let Some((window, step)) = advice.passed {
            self.count_passed(window, step);
        }
        self.prefetch(page, advice.stride, advice.pages);
    }

    /// The faulting stream reached step `upto` of `window`: the prefetched
    /// pages before it that are still mapped were read without a fault (or
    /// skipped, which a sequential stream does not do): count them as used.
    fn count_passed(&mut self, window: Window, upto: usize) {
        let mut hits = 0;
        for step in 0..upto.min(window.count) {
            if let Some(page) = self.page_at(window.page(step)) {
                hits += u64::from(self.table.take_prefetched(page));
            }
        }
        Counters::add(&self.counters.prefetch_hits, hits);
    }

    fn page_at(&self, page: i64) -> Option<u32> {
        u32::try_from(page).ok().filter(|&p| p < self.pages)
    }

    /// Of the `pages` pages after `page` along `stride`, read those in the
    /// store and map them, and zero-fill the untouched ones (mapped ones
    /// are there already).
    fn prefetch(&mut self, page: u32, stride: i64, pages: usize) {
        let mut wanted = std::mem::take(&mut self.prefetch_pages);
        let mut empty = std::mem::take(&mut self.zero_ahead_pages);
        wanted.clear();
        empty.clear();
        for step in 1..=pages as i64 {
            let Some(p) = self.page_at(i64::from(page) + step * stride) else { break };
            match self.table.get(p) {
                PageState::InStore => wanted.push(p),
                PageState::Empty if self.zero_ahead => empty.push(p),
                _ => {}
            }
        }
        let room = self.room_for(wanted.len() + empty.len());
        wanted.truncate(room);
        empty.truncate(room - wanted.len());
        empty.sort_unstable();
        self.zero_fill_ahead(&empty);
        self.zero_ahead_pages = empty;
        wanted.sort_unstable();
        if wanted.len() >= MARKER_MIN_PAGES {
            // The marker: left in the store, so the stream faults on it
            // halfway through, and the next window is read while it goes
            // through the second half, instead of after it.
            wanted.remove(wanted.len() / 2);
        }
        if !wanted.is_empty() && self.read_pages(&wanted) {
            self.map_prefetched(&wanted);
        }
        self.prefetch_pages = wanted;
    }

    /// Evict until `count` more pages fit in the budget; how many fit. A
    /// window's room goes in batches of up to `WINDOW_BATCH_PAGES`: with the
    /// adaptive batch alone (32 pages on a fast store) a 512-page window
    /// waited on 14 write-backs for a free staging half, and sequential
    /// scans ran at 60 K pages/s instead of 100 K; a whole window per batch
    /// was no faster, and its buffers (staging, ciphertext, the write-back
    /// connection's) pushed `memlend run` over a cgroup limit of budget +
    /// 16 MiB (the far_micro memlend-ssd-cg peer).
    fn room_for(&mut self, count: usize) -> usize {
        let batch_pages = self.batch.pages().max(WINDOW_BATCH_PAGES.min(self.batch.max()));
        // Each batch frees up to `batch_pages`; a batch that frees none
        // (every victim kept) ends the loop through the bound.
        for _ in 0..count.div_ceil(batch_pages) + 1 {
            let need = (self.table.resident() + count).saturating_sub(self.budget_pages);
            if need == 0 {
                break;
            }
            self.evict(need.min(batch_pages).max(self.batch.pages()));
        }
        count.min(self.budget_pages.saturating_sub(self.table.resident()))
    }

    /// One store read for `pages` (sorted), runs of consecutive pages joined,
    /// into `prefetch_buf`. A failure is logged; nobody waits on these pages.
    fn read_pages(&mut self, pages: &[u32]) -> bool {
        self.prefetch_buf.resize(pages.len() * PAGE_SIZE, 0);
        let mut ops = Vec::with_capacity(pages.len());
        let mut rest = self.prefetch_buf.as_mut_slice();
        for run in runs(pages) {
            let (buf, tail) = rest.split_at_mut(run.len() * PAGE_SIZE);
            ops.push(ReadOp { page: u64::from(run[0]), buf });
            rest = tail;
        }
        match self.store.read(&mut ops) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("fault handler: prefetch of {} pages failed: {e}", pages.len());
                false
            }
        }
    }

    /// Map the pages read into `prefetch_buf`, one UFFDIO_COPY per run, all
    /// write-protected (`Clean`) or all writable (`Dirty`). Stops at the
    /// first refusal (EAGAIN while an event is queued): pages not mapped
    /// stay `InStore`.
    fn map_prefetched(&mut self, pages: &[u32]) {
        let writable = self.intent.map_writable();
        let now = if writable { PageState::Dirty } else { PageState::Clean };
        let mut offset = 0;
        let mut mapped = 0;
        for run in runs(pages) {
            let bytes = &self.prefetch_buf[offset..offset + run.len() * PAGE_SIZE];
            offset += bytes.len();
            let (copied, result) = self.uffd.copy_run(self.page_addr(run[0]), bytes, !writable);
            for &page in &run[..copied / PAGE_SIZE] {
                self.table.map_prefetched(page, now);
                mapped += 1;
            }
            if let Err(e) = result {
                tracing::debug!("fault handler: prefetch mapping stopped: {e}");
                break;
            }
        }
        Counters::add(&self.counters.pages_prefetched, mapped);
        let writable_pages = if writable { mapped } else { 0 };
        Counters::add(&self.counters.store_pages_mapped_writable, writable_pages);
        self.publish_resident();
    }

    /// Map zeroed pages over `pages` (sorted, all `Empty`), one COPY per
    /// run, writable and `Dirty`. Not UFFDIO_ZEROPAGE: shared zero-page
    /// PTEs, written by the program (copy-on-write) while eviction moved
    /// their neighbours out, lost pages in `tests/write_intent.rs` (a
    /// staging slot found occupied, then the page gone); real pages never
    /// did, and save the program its copy-on-write fault besides. Stops at
    /// the first refusal; the rest stay `Empty` and fault on their own.
    fn zero_fill_ahead(&mut self, pages: &[u32]) {
        let mut mapped = 0;
        for run in runs(pages) {
            let len_bytes = run.len() * PAGE_SIZE;
            if self.zero_run.len() < len_bytes {
                self.zero_run = vec![0; len_bytes];
            }
            let zeros = &self.zero_run[..len_bytes];
            let (done, result) = self.uffd.copy_run(self.page_addr(run[0]), zeros, false);
            for &page in &run[..done / PAGE_SIZE] {
                self.table.map(page, PageState::Dirty);
                mapped += 1;
            }
            if let Err(e) = result {
                tracing::debug!("fault handler: zero-fill ahead stopped: {e}");
                break;
            }
        }
        Counters::add(&self.counters.pages_zeroed_ahead, mapped);
        self.publish_resident();
    }
}

/// Maximal runs of consecutive page numbers in sorted `pages`.
fn runs(pages: &[u32]) -> impl Iterator<Item = &[u32]> {
    pages.chunk_by(|a, b| b.checked_sub(*a) == Some(1))
}
