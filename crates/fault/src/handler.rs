//! The handler thread: reads fault messages and resolves each one, evicting a
//! batch first when the resident budget is full. It alone owns the page
//! table, so the state machine needs no locks.

use crate::discards::Discards;
use crate::mem::Mapping;
use crate::state::{PageState, PageTable};
use crate::stats::Counters;
use crate::trend::Trend;
use crate::uffd::{self, Fault, Msg, Ready, Uffd};
use memlend_store::{PageStore, ReadOp, StoreResult, PAGE_SIZE};
use std::io;
use std::io::PipeReader;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// UFFDIO_* answers EAGAIN while the address space is changing under it
/// (mremap, fork); such a change is short, so a few tries suffice.
const EAGAIN_TRIES: usize = 16;
/// Store reads are retried this many times before the page is poisoned.
const READ_TRIES: usize = 3;
/// Poll wakes at least this often even with nothing to do.
const POLL_TIMEOUT_MS: i32 = 1000;
/// While faults wait for a retry, poll this often.
const DEFERRED_POLL_MS: i32 = 1;
/// Faults put off because an event was pending (EAGAIN); each is one
/// blocked thread, so this many is plenty. Past it, a faulter is woken
/// instead and faults again.
const MAX_DEFERRED: usize = 64;

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

/// What became of a fault.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Done,
    /// A UFFDIO call kept answering EAGAIN: an event (REMOVE, UNMAP) is
    /// queued behind this fault, and until we read it the kernel refuses
    /// to map pages. The message is consumed and its thread still waits.
    Again,
}

fn is_eagain(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN)
}

pub(crate) struct Handler {
    pub uffd: Uffd,
    /// The staging mapping's own descriptor (see `Uffd::open_staging`);
    /// UFFDIO_MOVE into staging is issued on it.
    pub staging_uffd: Uffd,
    /// Start of the region; pages are `base + page * PAGE_SIZE`.
    pub base: usize,
    pub pages: u32,
    pub table: PageTable,
    pub store: Arc<dyn PageStore>,
    pub counters: Arc<Counters>,
    pub discards: Arc<Discards>,
    pub budget_pages: usize,
    /// Registered with `staging_uffd` (UFFDIO_MOVE wants that of its
    /// target); one slot per page of an eviction batch, empty between
    /// batches.
    pub staging: Mapping,
    /// One page: the target of store reads.
    pub page_buf: Vec<u8>,
    /// One page of zeroes, copied in for write faults on empty pages.
    pub zero_page: Vec<u8>,
    pub victims: Vec<u32>,
    /// Scratch for an eviction batch: (staging slot, page) of dirty pages
    /// with data.
    pub dirty: Vec<(usize, u32)>,
    /// Faults to try again once pending events are read; at most
    /// `MAX_DEFERRED`.
    pub deferred: Vec<Fault>,
    pub trend: Trend,
    /// Keep this many pages free below the budget when idle (eviction
    /// ahead of need); 0 turns it off.
    pub low_water_pages: usize,
    /// The last eviction ahead freed nothing (victims kept, write-back
    /// failed): do not try again until a message comes.
    pub headroom_stalled: bool,
    /// How long to poll without sleeping before a sleeping wait.
    pub spin: Duration,
    /// Running average of the idle time before a message came.
    pub recent_gap: Duration,
    /// Scratch for prefetch: the pages of one window, and their bytes.
    pub prefetch_pages: Vec<u32>,
    pub prefetch_buf: Vec<u8>,
}

impl Handler {
    /// Serve faults until the stop pipe is written to or closed, then give
    /// the ranges up so that unmapping them waits on nobody. If serving
    /// fails (a panic, or poll/read on the uffd failing), fall back to
    /// `failed`: every page not mapped then raises SIGBUS instead of
    /// leaving its faulting threads waiting for ever.
    pub fn run(mut self, stop: PipeReader) {
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| self.serve(&stop)));
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(reason)) => Some(reason),
            Err(panic) => Some(format!("panicked: {}", panic_text(panic.as_ref()))),
        };
        if let Some(reason) = failure {
            self.failed(&reason, &stop);
        }
        self.unregister();
    }

    fn serve(&mut self, stop: &PipeReader) -> Result<(), String> {
        let mut msgs = [Msg::default(); 16];
        loop {
            if self.counters.fail_requested.load(Relaxed) {
                panic!("handler failure forced through Region::fail_handler_for_tests");
            }
            let ahead = self.wants_headroom();
            let timeout = match (ahead, self.deferred.is_empty()) {
                (true, _) => 0,
                (false, false) => DEFERRED_POLL_MS,
                (false, true) => POLL_TIMEOUT_MS,
            };
            match self.wait(stop, timeout) {
                Ok(Ready::Stop) => return Ok(()),
                Ok(Ready::Nothing) if ahead => self.evict_ahead(),
                Ok(Ready::Nothing) => {}
                Ok(Ready::Faults) => {
                    let n = self.uffd.read_msgs(&mut msgs).map_err(|e| format!("read: {e}"))?;
                    self.headroom_stalled = false;
                    msgs[..n].iter().for_each(|&msg| self.message(msg));
                }
                Err(e) => return Err(format!("poll: {e}")),
            }
            self.retry_deferred();
        }
    }

    /// `uffd::wait`, but first, if spinning is on, the wait would sleep,
    /// and messages have lately come sooner than `spin` after the handler
    /// went idle, poll without sleeping for up to `spin`: a fault that
    /// comes meanwhile is seen without waking a sleeping thread. When
    /// faults come further apart, spinning would only burn the core (and,
    /// where the faulting thread shares it, delay that thread), so the
    /// handler sleeps at once.
    fn wait(&mut self, stop: &PipeReader, timeout_ms: i32) -> io::Result<Ready> {
        let idle_since = Instant::now();
        let spin = timeout_ms > 0 && !self.spin.is_zero() && self.recent_gap < self.spin;
        if spin {
            let deadline = idle_since + self.spin;
            // Bounded by the deadline; each turn is one poll syscall.
            while Instant::now() < deadline {
                match uffd::wait(&self.uffd, stop, 0)? {
                    Ready::Nothing => std::hint::spin_loop(),
                    ready => return Ok(self.note_gap(idle_since, ready)),
                }
            }
        }
        let ready = uffd::wait(&self.uffd, stop, timeout_ms)?;
        Ok(self.note_gap(idle_since, ready))
    }

    /// Keep a running average (weight 1/4) of the idle gap before messages.
    fn note_gap(&mut self, idle_since: Instant, ready: Ready) -> Ready {
        if ready == Ready::Faults {
            let gap = idle_since.elapsed();
            self.recent_gap = (self.recent_gap * 3 + gap) / 4;
        }
        ready
    }

    fn unregister(&self) {
        let region = self.pages as usize * PAGE_SIZE;
        if let Err(e) = self.uffd.unregister(self.base, region) {
            tracing::warn!("fault handler: unregistering the region failed: {e}");
        }
        let staging = &self.staging;
        if let Err(e) = self.staging_uffd.unregister(staging.addr(), staging.len_bytes()) {
            tracing::warn!("fault handler: unregistering staging failed: {e}");
        }
    }

    fn message(&mut self, msg: Msg) {
        match msg {
            Msg::Fault(fault) => {
                if self.fault(fault) == Step::Again {
                    self.defer(fault);
                }
            }
            Msg::Remove { start, end } => self.removed(start, end, false),
            Msg::Unmap { start, end } => self.removed(start, end, true),
            Msg::Remap { from, to, len } => self.remapped(from, to, len),
        }
    }

    fn defer(&mut self, fault: Fault) {
        Counters::add(&self.counters.faults_deferred, 1);
        if self.deferred.len() < MAX_DEFERRED {
            self.deferred.push(fault);
        } else if let Err(e) = self.uffd.wake(fault.addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            tracing::error!("fault handler: waking a deferred fault failed: {e}");
        }
    }

    /// Try the deferred faults once each; those still refused stay.
    fn retry_deferred(&mut self) {
        let mut deferred = std::mem::take(&mut self.deferred);
        deferred.retain(|&fault| self.fault(fault) == Step::Again);
        self.deferred = deferred;
    }

    fn fault(&mut self, fault: Fault) -> Step {
        let page = fault.addr.wrapping_sub(self.base) / PAGE_SIZE;
        if page >= self.pages as usize {
            tracing::error!("fault handler: fault at {:#x} outside the region", fault.addr);
            return Step::Done;
        }
        let page = page as u32;
        if fault.wp {
            return self.write_to_clean(page);
        }
        let missing = !self.table.get(page).is_resident();
        let result = match self.table.get(page) {
            PageState::Clean | PageState::Dirty => self.already_mapped(page),
            PageState::Empty => self.zero_fill(page, fault.write),
            PageState::InStore => self.fill_from_store(page, fault.write),
        };
        if missing && result.is_ok() {
            self.after_fault(page);
        }
        self.finish(page, result)
    }

    fn finish(&mut self, page: u32, result: io::Result<()>) -> Step {
        self.publish_resident();
        match result {
            Ok(()) => Step::Done,
            Err(e) if is_eagain(&e) => Step::Again,
            Err(e) => {
                tracing::error!("fault handler: page {page} could not be mapped: {e}");
                self.poison(page)
            }
        }
    }

    /// A write hit a write-protected page. If it is `Clean`, its store copy
    /// goes stale now: mark it dirty before lifting the protection, which
    /// wakes the writer. `Dirty` means another thread's message for the same
    /// page came first. If the page was evicted since, the writer only needs
    /// waking: its retry faults as missing.
    fn write_to_clean(&mut self, page: u32) -> Step {
        let page_addr = self.page_addr(page);
        let state = self.table.get(page);
        if state == PageState::Clean {
            if self.table.written(page) {
                Counters::add(&self.counters.prefetch_hits, 1);
            }
            Counters::add(&self.counters.write_protect, 1);
        }
        let result = if state.is_resident() {
            retry_eagain(|| self.uffd.unprotect(page_addr, PAGE_SIZE))
        } else {
            self.uffd.wake(page_addr, PAGE_SIZE)
        };
        match result {
            Ok(()) => Step::Done,
            Err(e) if is_eagain(&e) => Step::Again,
            Err(e) => {
                // The page stays dirty (the safe side); the writer's retry faults again.
                tracing::error!("fault handler: unprotecting page {page} failed: {e}");
                let _ = self.uffd.wake(page_addr, PAGE_SIZE);
                Step::Done
            }
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
            return match self.poison(page) {
                Step::Done => Ok(()),
                Step::Again => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
            };
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
        if self.table.map(page, now) {
            Counters::add(&self.counters.ghost_hits, 1);
        }
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

    pub(crate) fn page_addr(&self, page: u32) -> usize {
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
    pub(crate) fn poison(&mut self, page: u32) -> Step {
        let page_addr = self.page_addr(page);
        match resolve(&self.uffd, page_addr, || self.uffd.poison(page_addr, PAGE_SIZE)) {
            Ok(()) => Counters::add(&self.counters.pages_poisoned, 1),
            Err(e) if is_eagain(&e) => return Step::Again,
            Err(e) => tracing::error!("fault handler: poisoning page {page} failed: {e}"),
        }
        Step::Done
    }

    pub(crate) fn publish_resident(&self) {
        let resident = self.table.resident() as u64;
        self.counters.pages_resident.store(resident, Relaxed);
    }
}

/// Run one UFFDIO_* call that maps the page at `page_addr`. EEXIST means it
/// is mapped already, which is all we wanted; the kernel wakes waiters only
/// on success, so wake them here.
pub(crate) fn resolve(
    uffd: &Uffd,
    page_addr: usize,
    call: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
    match retry_eagain(call) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => uffd.wake(page_addr, PAGE_SIZE),
        other => other,
    }
}

/// Run one UFFDIO_* call, retrying EAGAIN a bounded number of times.
pub(crate) fn retry_eagain(mut call: impl FnMut() -> io::Result<()>) -> io::Result<()> {
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

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text
    } else {
        "(no message)"
    }
}
