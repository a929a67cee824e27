//! The handler thread: reads fault messages and resolves each one, evicting a
//! batch first when the resident budget is full. It alone owns the page
//! table, so the state machine needs no locks.

use crate::mem::Mapping;
use crate::state::{PageState, PageTable};
use crate::stats::Counters;
use crate::uffd::{self, Fault, Ready, Uffd};
use memlend_store::{PageStore, ReadOp, StoreResult, WriteOp, PAGE_SIZE};
use std::io;
use std::io::PipeReader;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// UFFDIO_* answers EAGAIN while the address space is changing under it
/// (mremap, fork); such a change is short, so a few tries suffice.
const EAGAIN_TRIES: usize = 16;
/// Store reads are retried this many times before the page is poisoned.
const READ_TRIES: usize = 3;
/// Poll wakes at least this often even with nothing to do.
const POLL_TIMEOUT_MS: i32 = 1000;

#[derive(Clone, Copy)]
enum Fill {
    Zero,
    Store,
}

impl Fill {
    fn counter(self, counters: &Counters) -> &AtomicU64 {
        match self {
            Fill::Zero => &counters.zero_filled,
            Fill::Store => &counters.from_store,
        }
    }
}

pub(crate) struct Handler {
    pub uffd: Uffd,
    /// Start of the region; pages are `base + page * PAGE_SIZE`.
    pub base: usize,
    pub pages: u32,
    pub table: PageTable,
    pub store: Arc<dyn PageStore>,
    pub counters: Arc<Counters>,
    pub budget_pages: usize,
    /// Registered with `uffd` too (UFFDIO_MOVE wants that of its target);
    /// one slot per page of an eviction batch, empty between batches.
    pub staging: Mapping,
    /// One page: the target of store reads.
    pub page_buf: Vec<u8>,
    /// One page of zeroes, copied in for write faults on empty pages.
    pub zero_page: Vec<u8>,
    pub victims: Vec<u32>,
    /// Scratch for an eviction batch: (staging slot, page) of dirty pages
    /// with data.
    pub dirty: Vec<(usize, u32)>,
}

impl Handler {
    /// Serve faults until the stop pipe is written to or closed.
    pub fn run(mut self, stop: PipeReader) {
        let mut faults = [Fault::default(); 16];
        loop {
            match uffd::wait(&self.uffd, &stop, POLL_TIMEOUT_MS) {
                Ok(Ready::Stop) => return,
                Ok(Ready::Nothing) => continue,
                Ok(Ready::Faults) => {}
                Err(e) => {
                    tracing::error!("fault handler: poll failed, stopping: {e}");
                    return;
                }
            }
            let count = match self.uffd.read_faults(&mut faults) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("fault handler: reading faults failed, stopping: {e}");
                    return;
                }
            };
            for &fault in &faults[..count] {
                self.fault(fault);
            }
        }
    }

    fn fault(&mut self, fault: Fault) {
        let page = fault.addr.wrapping_sub(self.base) / PAGE_SIZE;
        if page >= self.pages as usize {
            tracing::error!("fault handler: fault at {:#x} outside the region", fault.addr);
            return;
        }
        let page = page as u32;
        if fault.wp {
            self.write_to_clean(page);
            return;
        }
        let result = match self.table.get(page) {
            PageState::Clean | PageState::Dirty => self.already_mapped(page),
            PageState::Empty => self.zero_fill(page, fault.write),
            PageState::InStore => self.fill_from_store(page, fault.write),
        };
        if let Err(e) = result {
            tracing::error!("fault handler: page {page} could not be mapped: {e}");
            self.poison(page);
        }
        self.publish_resident();
    }

    /// A write hit a write-protected page. If it is `Clean`, its store copy
    /// goes stale now: mark it dirty before lifting the protection, which
    /// wakes the writer. `Dirty` means another thread's message for the same
    /// page came first. If the page was evicted since, the writer only needs
    /// waking: its retry faults as missing.
    fn write_to_clean(&mut self, page: u32) {
        let page_addr = self.page_addr(page);
        let state = self.table.get(page);
        if state == PageState::Clean {
            self.table.dirtied(page);
            Counters::add(&self.counters.write_protect, 1);
        }
        let result = if state.is_resident() {
            retry_eagain(|| self.uffd.unprotect(page_addr, PAGE_SIZE))
        } else {
            self.uffd.wake(page_addr, PAGE_SIZE)
        };
        if let Err(e) = result {
            // The page stays dirty (the safe side); the writer's retry faults again.
            tracing::error!("fault handler: unprotecting page {page} failed: {e}");
            let _ = self.uffd.wake(page_addr, PAGE_SIZE);
        }
    }

    /// Usually another message for this page came first and mapped it: then
    /// ZEROPAGE answers EEXIST and the thread only needs waking. If instead
    /// the owner dropped the page (MADV_DONTNEED), it now reads as zero, as
    /// that call promises, rather than faulting for ever; it is `Dirty` from
    /// then on, since the store's copy is not zeroes and a write to the zero
    /// page is a copy-on-write we never see.
    fn already_mapped(&mut self, page: u32) -> io::Result<()> {
        let page_addr = self.page_addr(page);
        match retry_eagain(|| self.uffd.zeropage(page_addr, PAGE_SIZE)) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                Counters::add(&self.counters.already_mapped, 1);
                self.uffd.wake(page_addr, PAGE_SIZE)
            }
            Ok(()) => {
                self.table.dirtied(page);
                Ok(())
            }
            other => other,
        }
    }

    /// A read maps the shared zero page; a write gets its own zeroed page at
    /// once, saving the copy-on-write fault that would follow. Either way the
    /// page is `Dirty`: the store holds no current copy of it, and the
    /// zero page cannot be write-protected (ZEROPAGE has no WP mode), so a
    /// write to it is a copy-on-write we never see. Eviction's all-zero check
    /// sends it back to `Empty` if it was never written.
    fn zero_fill(&mut self, page: u32, write: bool) -> io::Result<()> {
        self.make_room();
        self.record_mapped(page, Fill::Zero, PageState::Dirty);
        let page_addr = self.page_addr(page);
        let result = if write {
            resolve(&self.uffd, page_addr, || self.uffd.copy(page_addr, &self.zero_page, false))
        } else {
            resolve(&self.uffd, page_addr, || self.uffd.zeropage(page_addr, PAGE_SIZE))
        };
        self.undo_if_failed(page, PageState::Empty, Fill::Zero, result)
    }

    /// A read maps the page write-protected and `Clean`: its store copy is
    /// current until a write faults. A write maps it writable and `Dirty`
    /// at once, sparing the WP fault that would follow.
    fn fill_from_store(&mut self, page: u32, write: bool) -> io::Result<()> {
        if let Err(e) = self.read_page(page) {
            tracing::error!("fault handler: store read of page {page} failed: {e}");
            self.poison(page);
            return Ok(());
        }
        self.make_room();
        let now = if write { PageState::Dirty } else { PageState::Clean };
        self.record_mapped(page, Fill::Store, now);
        let page_addr = self.page_addr(page);
        let result =
            resolve(&self.uffd, page_addr, || self.uffd.copy(page_addr, &self.page_buf, !write));
        self.undo_if_failed(page, PageState::InStore, Fill::Store, result)
    }

    /// Count `page` as mapped before the ioctl that maps it: that ioctl wakes
    /// the faulting thread, which may read the stats at once.
    fn record_mapped(&mut self, page: u32, fill: Fill, now: PageState) {
        self.table.map(page, now);
        Counters::add(fill.counter(&self.counters), 1);
        self.publish_resident();
    }

    fn undo_if_failed(
        &mut self,
        page: u32,
        was: PageState,
        fill: Fill,
        result: io::Result<()>,
    ) -> io::Result<()> {
        if result.is_err() {
            self.table.unmap_newest(page, was);
            fill.counter(&self.counters).fetch_sub(1, Relaxed);
        }
        result
    }

    fn page_addr(&self, page: u32) -> usize {
        self.base + page as usize * PAGE_SIZE
    }

    fn read_page(&mut self, page: u32) -> StoreResult<()> {
        let mut last = Ok(());
        for _ in 0..READ_TRIES {
            let mut ops = [ReadOp { page: u64::from(page), buf: &mut self.page_buf }];
            last = self.store.read(&mut ops);
            if last.is_ok() {
                break;
            }
        }
        last
    }

    /// The faulting thread gets SIGBUS at this page instead of waiting forever.
    fn poison(&mut self, page: u32) {
        let page_addr = self.page_addr(page);
        match resolve(&self.uffd, page_addr, || self.uffd.poison(page_addr, PAGE_SIZE)) {
            Ok(()) => Counters::add(&self.counters.pages_poisoned, 1),
            Err(e) => tracing::error!("fault handler: poisoning page {page} failed: {e}"),
        }
    }

    fn make_room(&mut self) {
        if self.table.resident() >= self.budget_pages {
            self.evict_batch();
        }
    }

    /// Move the oldest pages out of the region, write them to the store in
    /// one call, and settle each one's state.
    fn evict_batch(&mut self) {
        let batch_pages = self.staging.len_bytes() / PAGE_SIZE;
        let mut victims = std::mem::take(&mut self.victims);
        self.table.take_victims(batch_pages, &mut victims);
        let staged = self.stage(&mut victims);
        if staged == 0 {
            self.victims = victims;
            return;
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        let (clean, zero) = self.sort_staged(&victims[..staged], &mut dirty);
        self.drop_clean(&clean);
        match write_back(self.store.as_ref(), &self.staging, &dirty) {
            Ok(()) => {
                for &(_, page) in &dirty {
                    self.table.evicted(page);
                }
                // A page of zeroes needs no store copy: as Empty it is
                // zero-filled on the next touch, whatever the store holds.
                for &(_, page) in &zero {
                    self.table.emptied(page);
                }
                Counters::add(&self.counters.eviction_batches, 1);
                Counters::add(&self.counters.pages_written_back, dirty.len() as u64);
                Counters::add(&self.counters.pages_zero_dropped, zero.len() as u64);
            }
            Err(e) => {
                let count = dirty.len();
                tracing::error!("fault handler: write-back of {count} pages failed: {e}");
                self.unstage(&dirty);
                self.unstage(&zero);
            }
        }
        if let Err(e) = self.staging.discard(0, staged * PAGE_SIZE) {
            tracing::error!("fault handler: clearing staging failed: {e}");
        }
        self.victims = victims;
        dirty.clear();
        self.dirty = dirty;
    }

    /// Sort staged pages (slot `i` holds `staged[i]`) three ways: clean
    /// ones (store copy current), returned first; dirty ones holding data, as
    /// (slot, page) into `dirty`; dirty ones that are all zeroes, returned
    /// second as (slot, page).
    fn sort_staged(
        &self,
        staged: &[u32],
        dirty: &mut Vec<(usize, u32)>,
    ) -> (Vec<u32>, Vec<(usize, u32)>) {
        let mut clean = Vec::new();
        let mut zero = Vec::new();
        for (slot, &page) in staged.iter().enumerate() {
            if self.table.get(page) == PageState::Clean {
                clean.push(page);
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
    fn drop_clean(&mut self, clean: &[u32]) {
        for &page in clean {
            self.table.evicted(page);
        }
        Counters::add(&self.counters.pages_clean_dropped, clean.len() as u64);
    }

    /// Move each victim into the next staging slot. Victims that moved are
    /// gathered at the front of `victims`, in slot order; returns how many.
    fn stage(&mut self, victims: &mut [u32]) -> usize {
        let mut staged = 0;
        for i in 0..victims.len() {
            let page = victims[i];
            let src = self.base + page as usize * PAGE_SIZE;
            let dst = self.staging.addr() + staged * PAGE_SIZE;
            match retry_eagain(|| self.uffd.move_pages(dst, src, PAGE_SIZE)) {
                Ok(()) => {
                    victims[staged] = page;
                    staged += 1;
                }
                // Dropped behind our back (MADV_DONTNEED by the owner).
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => self.table.emptied(page),
                Err(e) => {
                    tracing::warn!("fault handler: page {page} cannot move out, kept: {e}");
                    self.table.requeue(page);
                }
            }
        }
        staged
    }

    /// The store refused the batch: map the staged (slot, page) pairs back
    /// where they were, writable; they are `Dirty` already.
    fn unstage(&mut self, staged: &[(usize, u32)]) {
        for &(slot, page) in staged {
            let page_addr = self.page_addr(page);
            let bytes = self.staging.present_pages(slot, 1);
            match resolve(&self.uffd, page_addr, || self.uffd.copy(page_addr, bytes, false)) {
                Ok(()) => self.table.requeue(page),
                Err(e) => {
                    tracing::error!("fault handler: page {page} lost, cannot restore: {e}");
                    self.table.emptied(page);
                    self.poison(page);
                }
            }
        }
    }

    fn publish_resident(&self) {
        let resident = self.table.resident() as u64;
        self.counters.pages_resident.store(resident, Relaxed);
    }
}

/// Run one UFFDIO_* call that maps the page at `page_addr`. EEXIST means it
/// is mapped already, which is all we wanted; the kernel wakes waiters only
/// on success, so wake them here.
fn resolve(uffd: &Uffd, page_addr: usize, call: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    match retry_eagain(call) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => uffd.wake(page_addr, PAGE_SIZE),
        other => other,
    }
}

/// Run one UFFDIO_* call, retrying EAGAIN a bounded number of times.
fn retry_eagain(mut call: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    let mut last = Ok(());
    for _ in 0..EAGAIN_TRIES {
        last = call();
        match &last {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
            _ => return last,
        }
    }
    last
}

/// One store `write` for the staged (slot, page) pairs, with runs of
/// consecutive pages in consecutive slots joined into one op. Nothing to
/// write is no call at all.
fn write_back(
    store: &dyn PageStore,
    staging: &Mapping,
    staged: &[(usize, u32)],
) -> StoreResult<()> {
    if staged.is_empty() {
        return Ok(());
    }
    let mut ops: Vec<WriteOp<'_>> = Vec::with_capacity(staged.len());
    let mut run_start = 0;
    for i in 1..=staged.len() {
        let joins = i < staged.len()
            && staged[i].0 == staged[i - 1].0 + 1
            && staged[i].1 == staged[i - 1].1 + 1;
        if !joins {
            ops.push(WriteOp {
                page: u64::from(staged[run_start].1),
                data: staging.present_pages(staged[run_start].0, i - run_start),
            });
            run_start = i;
        }
    }
    store.write(&ops)
}
