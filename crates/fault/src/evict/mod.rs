//! Eviction: a batch of victims is moved out of the region (UFFDIO_MOVE into
//! a staging half), sorted into clean, all-zero and dirty, and the dirty
//! ones are written to the store in one call on the write-back thread
//! (`evict/writeback.rs`) while the handler goes on.

pub(crate) mod batch;
mod moveout;
pub(crate) mod write_failures;
pub(crate) mod writeback;

use crate::evict::writeback::{Done, Job};
use crate::kernel::uffd::resolve;
use crate::shared::Core;
use crate::state::PageState;
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;
use std::io;
use std::time::Instant;

/// Told of each batch's victims after they are chosen and before they move
/// out, while still mapped where they were: a fork's pages are written or
/// unshared there (`fork::Forks`). Eviction knows no more of forks.
pub(crate) trait BeforeMove {
    fn before_move(&mut self, core: &mut Core, victims: &[u32]);
}

/// What eviction owns: where victims go, the thread that writes them, and
/// how many go at once.
pub(crate) struct Eviction {
    /// Registered with the handler's `staging_uffd` (UFFDIO_MOVE wants that
    /// of its target); `HALVES` halves of one slot per page of the largest
    /// eviction batch. A half is empty unless a batch is in it.
    pub staging: std::sync::Arc<crate::kernel::mem::Mapping>,
    /// The write-back thread, and the pages it holds: page -> staging slot.
    /// At most `HALVES` batches, so bounded by the staging size.
    pub writer: crate::evict::writeback::Writer,
    pub writing: std::collections::HashMap<u32, usize>,
    /// Pages per eviction batch, adapted to the store's write latency;
    /// `staging` has room for its maximum.
    pub batch: crate::evict::batch::BatchSize,
    pub victims: Vec<u32>,
    /// Keep this many pages free below the budget when idle (eviction
    /// ahead of need); 0 turns it off.
    pub low_water_pages: usize,
    /// The last eviction ahead freed nothing (victims kept, write-back
    /// failed): do not try again until a message comes.
    pub headroom_stalled: bool,
    /// Write-back failures, logged at most once per interval.
    pub failures: crate::evict::write_failures::FailureLog,
    /// Take `Clean` victims only (a fork's pause, `fork/clean.rs`).
    pub clean_only: bool,
    /// A page that cannot move out was logged (once per region).
    pub unmovable_said: bool,
}

/// A victim in staging: (slot, page).
type Staged = (usize, u32);

/// Pages per eviction ahead of need: a fault arriving meanwhile waits for
/// this slice only, not a whole batch.
const AHEAD_BATCH_PAGES: usize = 8;

impl Eviction {
    /// Nothing is pending but the region is within the low-water margin of
    /// its budget: evict now, so that the next fault finds room. The margin
    /// is never more than the pages held beyond the budget: a region whose
    /// pages all fit keeps them all mapped (with a fixed margin, a program
    /// that fit its budget exactly missed on every page of a scan).
    pub(crate) fn wants_headroom(&self, core: &Core) -> bool {
        let free = core.mapped_budget().saturating_sub(core.table.resident());
        let over = core.table.held().saturating_sub(core.budget_pages);
        let ready = !self.headroom_stalled && self.writer.free_half().is_some();
        ready && free < self.low_water_pages.min(over)
    }

    /// One batch, ahead of need; the serve loop polls for faults between
    /// batches, so a fault waits for one batch at most.
    pub(crate) fn evict_ahead(&mut self, core: &mut Core, gate: &mut dyn BeforeMove) {
        let before = core.table.resident();
        // On a slow store any write costs a round trip: take a whole batch.
        let pages = if self.batch.slow() { self.batch.pages() } else { AHEAD_BATCH_PAGES };
        self.evict(core, gate, pages.min(self.batch.pages()));
        Counters::add(&core.counters.eviction_batches_ahead, 1);
        self.headroom_stalled = core.table.resident() >= before;
        core.publish_resident();
    }

    pub(crate) fn make_room(&mut self, core: &mut Core, gate: &mut dyn BeforeMove) {
        if core.table.resident() >= core.mapped_budget() {
            Counters::add(&core.counters.evictions_on_fault, 1);
            self.evict_batch(core, gate);
        }
    }

    /// Move the oldest pages out of the region and hand the dirty ones to the
    /// write-back thread; clean and all-zero ones are settled at once.
    pub(crate) fn evict_batch(&mut self, core: &mut Core, gate: &mut dyn BeforeMove) {
        self.evict(core, gate, self.batch.pages());
    }

    /// Evict until the mapped pages fit the budget, waiting for every
    /// write-back. At most one batch per page mapped.
    pub(crate) fn evict_down_to_budget(&mut self, core: &mut Core, gate: &mut dyn BeforeMove) {
        let turns_max = core.table.resident();
        for _ in 0..turns_max {
            if core.table.resident() <= core.mapped_budget() {
                break;
            }
            let before = core.table.resident();
            self.evict_batch(core, gate);
            if core.table.resident() >= before {
                break; // nothing could go: the victims stayed
            }
        }
        self.settle_all(core);
        core.publish_resident();
    }

    /// Evict up to `batch_pages` (at most a staging half); nothing while
    /// write-backs are failing (`FailureLog::holding_off`).
    pub(crate) fn evict(&mut self, core: &mut Core, gate: &mut dyn BeforeMove, batch_pages: usize) {
        if self.failures.holding_off() {
            return;
        }
        let half = self.free_half(core);
        let first_slot = half * self.batch.max();
        let mut victims = std::mem::take(&mut self.victims);
        let count = batch_pages.min(self.batch.max());
        let unused = if self.clean_only {
            core.table.take_clean_victims(count, &mut victims)
        } else {
            core.table.take_victims(count, &mut victims)
        };
        gate.before_move(core, &victims);
        Counters::add(&core.counters.prefetch_wasted, unused as u64);
        let staged = self.stage(core, &mut victims, first_slot);
        core.reserve.set_staged(half, staged);
        let mut dirty = Vec::with_capacity(staged);
        let (clean, zero) = self.sort_staged(core, &victims[..staged], first_slot, &mut dirty);
        self.victims = victims;
        self.drop_clean(core, &clean);
        // With the pool on, the victims it admits go to the write-back
        // thread to be compressed there: clean ones with dirty ones, alone
        // when the pool wants them.
        let wanted = match core.zpool.as_mut() {
            Some(pool) => !dirty.is_empty() || pool.wants_clean_batch(),
            None => false,
        };
        let (clean, pool_staged) = match core.zpool.as_ref() {
            Some(pool) if wanted => {
                let table = &core.table;
                let admit = |&(_, page): &Staged| pool.admits(table.victim_from_main(page));
                let pool_staged = dirty.iter().map(admit).collect();
                (clean.into_iter().filter(|v| admit(v)).collect(), pool_staged)
            }
            _ => (Vec::new(), Vec::new()),
        };
        // A page of zeroes needs no store copy: as Empty it is zero-filled
        // on the next touch, whatever the store holds.
        for &(_, page) in &zero {
            core.table.emptied(page);
        }
        Counters::add(&core.counters.pages_zero_dropped, zero.len() as u64);
        if dirty.is_empty() && clean.is_empty() {
            self.clear_half(core, half);
            return;
        }
        for &(slot, page) in &dirty {
            self.writing.insert(page, slot);
        }
        self.writer.send(Job { half, staged: dirty, clean, pool_staged });
    }

    /// A staging half no write-back holds, waiting for one if need be.
    fn free_half(&mut self, core: &mut Core) -> usize {
        self.settle_done(core);
        if let Some(half) = self.writer.free_half() {
            return half;
        }
        let waiting = Instant::now();
        let done = self.writer.wait().expect("no free half means a job is out");
        Counters::add(&core.counters.staging_waits, 1);
        Counters::add(&core.counters.staging_wait_ns, waiting.elapsed().as_nanos() as u64);
        self.settle(core, done);
        self.writer.free_half().expect("a job just finished")
    }

    /// Wait for every write-back in flight and settle it (before a fork).
    pub(crate) fn settle_all(&mut self, core: &mut Core) {
        while let Some(done) = self.writer.wait() {
            self.settle(core, done);
        }
    }

    /// Settle every write-back that has finished, without waiting.
    pub(crate) fn settle_done(&mut self, core: &mut Core) {
        while let Some(done) = self.writer.try_done() {
            self.settle(core, done);
        }
    }

    /// A write-back finished: its pages not faulted back or dropped since
    /// are in the store now or, if the write failed, go back where they were.
    fn settle(&mut self, core: &mut Core, done: Done) {
        let mut settled = Vec::with_capacity(done.staged.len());
        for &(slot, page) in &done.staged {
            if self.writing.get(&page) == Some(&slot) {
                self.writing.remove(&page);
                settled.push((slot, page));
            }
        }
        match done.result {
            Ok(()) => {
                self.batch.observe(done.staged.len(), done.took);
                core.reserve.set_batch_pages(self.batch.pages());
                core.intent.wrote_back(done.staged.len(), done.took);
                for &(_, page) in &settled {
                    core.table.evicted(page);
                }
                Counters::add(&core.counters.eviction_batches, 1);
                Counters::add(&core.counters.pages_written_back, done.staged.len() as u64);
                self.failures.succeeded();
            }
            Err(e) => {
                self.failures.note(done.staged.len(), &e);
                self.unstage(core, &settled);
            }
        }
        self.pool_keep(core, &done.packed);
        self.clear_half(core, done.half);
        core.publish_resident();
    }

    pub(crate) fn clear_half(&mut self, core: &mut Core, half: usize) {
        let half_pages = self.batch.max();
        if let Err(e) = self.staging.discard(half * half_pages * PAGE_SIZE, half_pages * PAGE_SIZE)
        {
            // Its pages stay counted in the reserve: they may still be there.
            tracing::error!("fault handler: clearing staging failed: {e}");
            return;
        }
        core.reserve.set_staged(half, 0);
    }

    /// A fault on a page whose write-back is in flight: map its staging
    /// copy back, writable (its store copy may not be current). Its
    /// write-back result is ignored from now on.
    pub(crate) fn refault_writing(
        &mut self,
        core: &mut Core,
        gate: &mut dyn BeforeMove,
        page: u32,
        slot: usize,
    ) -> io::Result<()> {
        self.make_room(core, gate);
        if self.writing.get(&page) != Some(&slot) {
            // Settled while making room; the caller serves it by its state.
            return Err(io::Error::from_raw_os_error(libc::EINPROGRESS));
        }
        self.writing.remove(&page);
        core.table.evicted(page);
        core.table.map(page, PageState::Dirty);
        Counters::add(&core.counters.from_staging, 1);
        let page_addr = core.page_addr(page);
        let bytes = self.staging.present_pages(slot, 1);
        let result = resolve(&core.uffd, page_addr, || core.uffd.copy(page_addr, bytes, false));
        if result.is_err() {
            // Still in flight, as far as anyone knows.
            core.table.unmap_newest(page, PageState::Dirty);
            core.counters.from_staging.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.writing.insert(page, slot);
        }
        result
    }

    /// Sort staged pages (slot `i` holds `staged[i]`) three ways: clean
    /// ones (store copy current), returned first as (slot, page); dirty ones holding data, as
    /// (slot, page) into `dirty`; dirty ones that are all zeroes, returned
    /// second as (slot, page).
    fn sort_staged(
        &self,
        core: &Core,
        staged: &[u32],
        first_slot: usize,
        dirty: &mut Vec<Staged>,
    ) -> (Vec<Staged>, Vec<Staged>) {
        let mut clean = Vec::new();
        let mut zero = Vec::new();
        for (i, &page) in staged.iter().enumerate() {
            let slot = first_slot + i;
            if core.table.get(page) == PageState::Clean {
                clean.push((slot, page));
            } else if self.staging.present_pages(slot, 1).iter().all(|&b| b == 0) {
                zero.push((slot, page));
            } else {
                dirty.push((slot, page));
            }
        }
        (clean, zero)
    }

    /// Clean victims were never written since they came from the store,
    /// whose copy is still theirs: back to `InStore` with no write.
    fn drop_clean(&mut self, core: &mut Core, clean: &[(usize, u32)]) {
        for &(_, page) in clean {
            core.table.evicted(page);
        }
        Counters::add(&core.counters.pages_clean_dropped, clean.len() as u64);
        core.intent.unwritten(clean.len());
    }

    /// A job's compressed victims go into the pool if they are still
    /// `InStore`. That state means the store holds exactly the bytes
    /// compressed: jobs settle in the order they were sent, so a page
    /// mapped and evicted again since is either not `InStore` now (mapped,
    /// or its newer write-back not settled) or was mapped only to be read
    /// (then its bytes never changed).
    fn pool_keep(&mut self, core: &mut Core, packed: &crate::zpool::Packed) {
        let Some(pool) = core.zpool.as_mut() else {
            return;
        };
        let table = &core.table;
        pool.insert_packed(packed, |page| table.get(page) == PageState::InStore);
    }

    /// The store refused the batch: map the staged (slot, page) pairs back
    /// where they were, writable; they are `Dirty` already.
    fn unstage(&mut self, core: &mut Core, staged: &[(usize, u32)]) {
        for &(slot, page) in staged {
            match self.copy_back(core, slot, page, false) {
                Ok(()) => core.table.requeue(page),
                Err(e) => {
                    tracing::error!("fault handler: page {page} lost, cannot restore: {e}");
                    core.table.emptied(page);
                    // Listed before the poisoning, which may be refused for
                    // now (EAGAIN, an event queued): the page's next fault
                    // poisons it then, and it never reads as zeros.
                    core.lost.insert(page);
                    let _ = core.poison(page);
                }
            }
        }
    }

    /// COPY a staged page back into the region (write-protected if `wp`).
    /// On the region's descriptor that answers EAGAIN while an event is
    /// queued behind the fault we are serving, and only we can read that
    /// event; the staging descriptor has no events, and the kernel lets it
    /// COPY into any registered range. Its COPY wakes only its own waiters,
    /// so wake the region's.
    pub(crate) fn copy_back(
        &self,
        core: &Core,
        slot: usize,
        page: u32,
        wp: bool,
    ) -> io::Result<()> {
        let page_addr = core.page_addr(page);
        let bytes = self.staging.present_pages(slot, 1);
        match resolve(&core.uffd, page_addr, || core.uffd.copy(page_addr, bytes, wp)) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                let staging = &core.staging_uffd;
                resolve(staging, page_addr, || staging.copy(page_addr, bytes, wp))?;
                core.uffd.wake(page_addr, PAGE_SIZE)
            }
            other => other,
        }
    }
}
