//! Prefetch: after a missing fault is answered (its thread already woken),
//! if the recent faults show a trend, read the next window of pages along
//! it in one store call and map them (write-protected unless `intent.rs`
//! says writable), so the stream finds them mapped. Untouched pages of the
//! window are zero-filled ahead too: a stream writing fresh memory then
//! takes one fault per window instead of one per page (the kernel gives
//! each zero page its own copy on the first write, with no message to us).

pub(crate) mod fetch;
pub(crate) mod read_block;
pub(crate) mod trend;

use crate::evict::{BeforeMove, Eviction};
use crate::kernel::uffd::Msg;
use crate::prefetch::fetch::{runs, Fetch, Fetcher, IN_FLIGHT_MAX};
use crate::prefetch::trend::{Window, REACH_WINDOWS};
use crate::shared::Core;
use crate::state::PageState;
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;

/// Most pages one eviction batch takes to make room for a window (1 MiB).
const WINDOW_BATCH_PAGES: usize = 256;

/// Windows of at least this many pages leave their middle page unmapped.
const MARKER_PAGES_MIN: usize = 16;

/// What prefetch owns: the trend it follows, the reads in flight, and
/// scratch made once.
pub(crate) struct Ahead {
    /// The fetch threads, and the prefetch windows they may be reading.
    pub fetcher: Fetcher,
    pub trend: crate::prefetch::trend::Trend,
    /// Zero-fill untouched pages along a trend.
    pub zero_ahead: bool,
    /// Scratch: the pages of one window.
    pub window_pages: Vec<u32>,
    /// The window buffers not in flight: with those in flight, always
    /// `IN_FLIGHT_MAX` of a largest window each, made once (a fresh one per
    /// window would be faulted in and zeroed each time).
    pub spare_bufs: Vec<crate::kernel::mem::PageBuf>,
    /// Scratch: the untouched pages of one window, and zeroes to copy over
    /// them (grown to the longest run seen, at most a window).
    pub zero_ahead_pages: Vec<u32>,
    pub zero_run: Vec<u8>,
}

impl Ahead {
    /// Called after a missing fault on `page` was resolved.
    pub(crate) fn after_fault(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
        page: u32,
    ) {
        let Some(advice) = self.trend.fault(page) else {
            return;
        };
        if let Some((window, step)) = advice.passed {
            self.count_passed(core, window, step);
        }
        self.prefetch(core, eviction, gate, page, advice.stride, advice.pages);
    }

    /// The faulting stream reached step `upto` of `window`: the prefetched
    /// pages before it that are still mapped were read without a fault (or
    /// skipped, which a sequential stream does not do): count them as used.
    fn count_passed(&mut self, core: &mut Core, window: Window, upto: usize) {
        let mut hits = 0;
        for step in 0..upto.min(window.count) {
            if let Some(page) = self.page_at(core, window.page(step)) {
                hits += u64::from(core.table.take_prefetched(page));
            }
        }
        Counters::add(&core.counters.prefetch_hits, hits);
    }

    /// A page of the region, not fenced off (`fences.rs`): a window
    /// stops at the first that is not.
    fn page_at(&self, core: &Core, page: i64) -> Option<u32> {
        u32::try_from(page).ok().filter(|&p| p < core.pages && !core.fences.has(p))
    }

    /// Of the pages along `stride` after `page`, have those in the store
    /// that are not in flight yet read on the fetch threads (`prefetch/fetch.rs`), a
    /// window of `pages` per read, until `IN_FLIGHT_MAX` windows are in
    /// flight (looking `REACH_WINDOWS` ahead); and zero-fill the untouched ones of the first window (mapped
    /// ones are there already). Room for them is made while the reads are
    /// in flight. Keeping the windows in flight, not one window per marker
    /// fault, is what lets the donor send the next window while this side
    /// decrypts and maps the last: with one, a sequential scan waited on
    /// the read of nearly every window.
    fn prefetch(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
        page: u32,
        stride: i64,
        pages: usize,
    ) {
        if self.fetcher.full() {
            self.finish_oldest_fetch(core, eviction, gate);
        }
        let mut wanted = std::mem::take(&mut self.window_pages);
        let mut empty = std::mem::take(&mut self.zero_ahead_pages);
        wanted.clear();
        empty.clear();
        let free_windows = IN_FLIGHT_MAX - self.fetcher.in_flight();
        let most = (free_windows * pages).min(core.mapped_budget());
        for step in 1..=(REACH_WINDOWS * pages) as i64 {
            let Some(p) = self.page_at(core, i64::from(page) + step * stride) else { break };
            match core.table.get(p) {
                PageState::InStore if wanted.len() < most && !self.fetcher.holds(p) => {
                    wanted.push(p)
                }
                PageState::Empty
                    if self.zero_ahead && step <= pages as i64 && !core.lost.contains(&p) =>
                {
                    empty.push(p)
                }
                _ => {}
            }
        }
        let mut fetching = 0;
        for window in wanted.chunks(pages.max(1)) {
            fetching += self.send_window(core, window);
        }
        self.window_pages = wanted;
        // Zero pages are a guess. While the pages held fit the budget they
        // may not push it over: that would evict real pages for ones the
        // program may never touch (a scan's window reaching past its data).
        let under = core.budget_pages.saturating_sub(core.table.held());
        if under > 0 {
            empty.truncate(under);
        }
        let room = self.room_for(core, eviction, gate, fetching + empty.len());
        empty.truncate(room.saturating_sub(fetching));
        empty.sort_unstable();
        self.zero_fill_ahead(core, &empty);
        self.zero_ahead_pages = empty;
    }

    /// Have `window` (pages in stride order) read on a fetch thread; how
    /// many pages went.
    fn send_window(&mut self, core: &mut Core, window: &[u32]) -> usize {
        let mut pages = window.to_vec();
        pages.sort_unstable();
        if pages.len() >= MARKER_PAGES_MIN {
            // The marker: left in the store, so the stream faults on it
            // halfway through, and asks for the next window then.
            pages.remove(pages.len() / 2);
        }
        let count = pages.len();
        let mut buf = self.spare_bufs.pop().expect("one buffer per window in flight");
        // Counted before `room_for` makes room for the window's pages.
        core.reserve.window_grew(buf.filling(count));
        self.fetcher.send(pages, buf);
        Counters::add(&core.counters.prefetch_reads, 1);
        count
    }

    /// Map every window in flight once it is read (waiting for them).
    pub(crate) fn finish_fetch(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
    ) {
        for _ in 0..IN_FLIGHT_MAX {
            self.finish_oldest_fetch(core, eviction, gate);
        }
    }

    fn finish_oldest_fetch(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
    ) {
        if let Some(fetch) = self.fetcher.wait() {
            self.fetched(core, eviction, gate, fetch);
        }
    }

    /// Map the windows in flight that have been read; never waits.
    pub(crate) fn poll_fetch(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
    ) {
        for _ in 0..IN_FLIGHT_MAX {
            match self.fetcher.try_done() {
                Some(fetch) => self.fetched(core, eviction, gate, fetch),
                None => break,
            }
        }
    }

    /// Wait for every window in flight and map it (before a fork).
    pub(crate) fn finish_all_fetches(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
    ) {
        while let Some(fetch) = self.fetcher.wait() {
            self.fetched(core, eviction, gate, fetch);
        }
    }

    /// The events in `msgs` were just read, so the threads behind them go
    /// on: a REMOVE's madvise zaps its range as soon as we have read it. A
    /// window in flight mapped after that could bring a zapped page back
    /// with its old bytes; so the windows are finished now, without the
    /// pages inside those ranges (the events then make them `Empty`).
    pub(crate) fn finish_fetch_before_events(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
        msgs: &[Msg],
    ) {
        if !self.fetcher.busy() {
            return;
        }
        let ranges: Vec<(usize, usize)> = (msgs.iter())
            .filter_map(|msg| match *msg {
                Msg::Remove { start, end } | Msg::Unmap { start, end } => Some((start, end)),
                Msg::Remap { from, len, .. } => Some((from, from + len)),
                Msg::Fault(_) | Msg::Fork { .. } => None,
            })
            .collect();
        if ranges.is_empty() {
            return;
        }
        let inside =
            |addr: usize| ranges.iter().any(|&(start, end)| addr + PAGE_SIZE > start && addr < end);
        for _ in 0..IN_FLIGHT_MAX {
            let Some(mut fetch) = self.fetcher.wait() else { return };
            let mut kept = 0;
            for i in 0..fetch.pages.len() {
                let page = fetch.pages[i];
                if !inside(core.page_addr(page)) {
                    let from = i * PAGE_SIZE;
                    let bytes = fetch.buf.bytes_mut(fetch.pages.len() * PAGE_SIZE);
                    bytes.copy_within(from..from + PAGE_SIZE, kept * PAGE_SIZE);
                    fetch.pages[kept] = page;
                    kept += 1;
                }
            }
            fetch.pages.truncate(kept);
            self.fetched(core, eviction, gate, fetch);
        }
    }

    /// A window was read: map what fits in the budget. A failure is only
    /// logged; nobody waits on these pages, which fault on their own.
    fn fetched(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
        fetch: Fetch,
    ) {
        let Fetch { mut pages, buf, result } = fetch;
        match result {
            Ok(()) => {
                // Room was made when the read went out; faults since may
                // have used it.
                pages.truncate(self.room_for(core, eviction, gate, pages.len()));
                self.map_prefetched(core, &pages, buf.bytes(pages.len() * PAGE_SIZE));
            }
            Err(e) => {
                tracing::warn!("fault handler: prefetch of {} pages failed: {e}", pages.len());
            }
        }
        self.spare_bufs.push(buf);
        debug_assert!(self.spare_bufs.len() <= IN_FLIGHT_MAX);
        self.window_pages = pages;
    }

    /// Evict until `count` more pages fit in the budget; how many fit. A
    /// window's room goes in batches of up to `WINDOW_BATCH_PAGES`: with the
    /// adaptive batch alone (32 pages on a fast store) a 512-page window
    /// waited on 14 write-backs for a free staging half, and sequential
    /// scans ran at 60 K pages/s instead of 100 K; a whole window per batch
    /// was no faster, and its buffers (staging, ciphertext, the write-back
    /// connection's) pushed `memlend run` over a cgroup limit of budget +
    /// 16 MiB (the far_micro memlend-ssd-cg peer).
    pub(crate) fn room_for(
        &mut self,
        core: &mut Core,
        eviction: &mut Eviction,
        gate: &mut dyn BeforeMove,
        count: usize,
    ) -> usize {
        let batch_pages = eviction.batch.pages().max(WINDOW_BATCH_PAGES.min(eviction.batch.max()));
        // Each batch frees up to `batch_pages`; a batch that frees none
        // (every victim kept) ends the loop through the bound.
        for _ in 0..count.div_ceil(batch_pages) + 1 {
            let need = (core.table.resident() + count).saturating_sub(core.mapped_budget());
            if need == 0 {
                break;
            }
            eviction.evict(core, gate, need.min(batch_pages).max(eviction.batch.pages()));
        }
        count.min(core.mapped_budget().saturating_sub(core.table.resident()))
    }

    /// Map the pages read into `buf`, one UFFDIO_COPY per run: the first
    /// few write-protected (`Clean`), as `intent.rs` says, the rest
    /// writable (`Dirty`). Stops at the first refusal (EAGAIN while an
    /// event is queued): pages not mapped stay `InStore`.
    pub(crate) fn map_prefetched(&mut self, core: &mut Core, pages: &[u32], buf: &[u8]) {
        let clean = core.intent.window_clean_pages(pages.len());
        let (head, tail) = buf.split_at(clean * PAGE_SIZE);
        let mut mapped = self.map_runs(core, &pages[..clean], head, PageState::Clean);
        if mapped == clean {
            let writable = self.map_runs(core, &pages[clean..], tail, PageState::Dirty);
            Counters::add(&core.counters.store_pages_mapped_writable, writable as u64);
            mapped += writable;
        }
        Counters::add(&core.counters.pages_prefetched, mapped as u64);
        core.publish_resident();
    }

    /// Map `pages` (sorted) from `buf`, one UFFDIO_COPY per run, in state
    /// `now`; how many were mapped before the first refusal.
    fn map_runs(&mut self, core: &mut Core, pages: &[u32], buf: &[u8], now: PageState) -> usize {
        let mut offset = 0;
        let mut mapped = 0;
        for run in runs(pages) {
            let bytes = &buf[offset..offset + run.len() * PAGE_SIZE];
            offset += bytes.len();
            let protect = now == PageState::Clean;
            let (copied, result) = core.uffd.copy_run(core.page_addr(run[0]), bytes, protect);
            for &page in &run[..copied / PAGE_SIZE] {
                core.table.map_prefetched(page, now);
                if let Some(pool) = core.zpool.as_mut() {
                    pool.remove(page);
                }
                mapped += 1;
            }
            if let Err(e) = result {
                tracing::debug!("fault handler: prefetch mapping stopped: {e}");
                break;
            }
        }
        mapped
    }

    /// Map zeroed pages over `pages` (sorted, all `Empty`), one COPY per
    /// run, writable and `Dirty`. Not UFFDIO_ZEROPAGE: shared zero-page
    /// PTEs, written by the program (copy-on-write) while eviction moved
    /// their neighbours out, lost pages in `tests/write_intent.rs` (a
    /// staging slot found occupied, then the page gone); real pages never
    /// did, and save the program its copy-on-write fault besides. Stops at
    /// the first refusal; the rest stay `Empty` and fault on their own.
    fn zero_fill_ahead(&mut self, core: &mut Core, pages: &[u32]) {
        let mut mapped = 0;
        for run in runs(pages) {
            let len_bytes = run.len() * PAGE_SIZE;
            if self.zero_run.len() < len_bytes {
                self.zero_run = vec![0; len_bytes];
            }
            let zeros = &self.zero_run[..len_bytes];
            let (done, result) = core.uffd.copy_run(core.page_addr(run[0]), zeros, false);
            for &page in &run[..done / PAGE_SIZE] {
                core.table.map(page, PageState::Dirty);
                mapped += 1;
            }
            if let Err(e) = result {
                tracing::debug!("fault handler: zero-fill ahead stopped: {e}");
                break;
            }
        }
        Counters::add(&core.counters.pages_zeroed_ahead, mapped);
        core.publish_resident();
    }
}
