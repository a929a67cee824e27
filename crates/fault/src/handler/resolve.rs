//! Resolving one fault by the page's state: zero-fill, a store read (with
//! the block around the page when `prefetch/read_block.rs` says so), a WP fault on a
//! clean page, or a message for a page mapped meanwhile.

use crate::handler::Handler;
use crate::kernel::uffd::{resolve, retry_eagain, Fault};
use crate::prefetch::read_block::{COMPANIONS_MAX, READ_BLOCK_PAGES_MAX};
use crate::shared::Step;
use crate::state::PageState;
use crate::stats::Counters;
use memlend_store::{PageStore, ReadOp, StoreResult, PAGE_SIZE};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Pauses between the tries of a store read before the page is poisoned.
/// A failure can be a moment early: a donor that revoked a lease answers
/// NoSuchSlab until the process's reclaim thread has put the lost lease's
/// stand-in (with its reason) in place, and that thread may only just be
/// running again (the process was stopped). 111 ms at most, on failure only.
const READ_PAUSES: [Duration; 3] =
    [Duration::from_millis(1), Duration::from_millis(10), Duration::from_millis(100)];

#[derive(Clone, Copy)]
enum Fill {
    Zero,
    Store,
    Pool,
}

impl Fill {
    fn counter(self, counters: &Counters) -> &AtomicU64 {
        match self {
            Fill::Zero => &counters.zero_filled,
            Fill::Store => &counters.from_store,
            Fill::Pool => &counters.from_pool,
        }
    }
}

/// Fault costs assumed before any is measured: a loopback store read and
/// a decompression, each with its UFFDIO_COPY.
const FAR_NS_GUESS: u64 = 25_000;
const POOL_NS_GUESS: u64 = 4_000;

/// One fault from the store or pool in this many is timed (`map_page`).
const LATENCY_SAMPLE_EVERY: u64 = 8;

/// COPY `bytes` to `page_addr` and wake its waiters. If `timed`, the copy
/// does not wake and the wake follows it, so that the instant just before
/// the wake can be returned: the moment the faulting thread is released
/// (the wake's own µs aside). Timing the COPY's return instead counted
/// the woken thread's run on this core, which it may take before the call
/// returns: redis's store faults read p99 139 us that way, 110 us of it in
/// the COPY. The split costs a system call, so only a sample is timed.
fn map_page(
    uffd: &crate::kernel::uffd::Uffd,
    page_addr: usize,
    bytes: &[u8],
    write_protect: bool,
    timed: bool,
) -> (io::Result<()>, Option<Instant>) {
    if !timed {
        return (resolve(uffd, page_addr, || uffd.copy(page_addr, bytes, write_protect)), None);
    }
    let copied = resolve(uffd, page_addr, || uffd.copy_no_wake(page_addr, bytes, write_protect));
    if copied.is_err() {
        return (copied, None);
    }
    let woken = Instant::now();
    if let Err(e) = uffd.wake(page_addr, PAGE_SIZE) {
        // The page is mapped, so its state stands; only the waiter is stuck.
        tracing::error!("fault handler: waking the thread of page {page_addr:#x} failed: {e}");
    }
    (Ok(()), Some(woken))
}

/// A timed fault's latency, message read to wake, and for one from the
/// store the parts of it: the read, making room, the map.
fn record_latency(c: &Counters, fill: Fill, latency_ns: u64, parts_ns: [u64; 3]) {
    if let Fill::Pool = fill {
        c.pool_fault_latency.record_ns(latency_ns);
        return;
    }
    c.store_fault_latency.record_ns(latency_ns);
    c.store_read_latency.record_ns(parts_ns[0]);
    c.store_room_latency.record_ns(parts_ns[1]);
    c.store_map_latency.record_ns(parts_ns[2]);
}

fn ns_between(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_nanos() as u64
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn is_eagain(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN)
}

impl Handler {
    pub(crate) fn fault(&mut self, fault: Fault) -> Step {
        let page = fault.addr.wrapping_sub(self.core.base) / PAGE_SIZE;
        if page >= self.core.pages as usize {
            tracing::error!("fault handler: fault at {:#x} outside the region", fault.addr);
            return Step::Done;
        }
        let page = page as u32;
        if let Some(trace) = self.core.trace.as_mut() {
            trace.record(page, fault.write || fault.wp);
        }
        if fault.wp {
            return self.write_to_clean(page);
        }
        if self.ahead.fetcher.holds(page) {
            // Its read is under way: wait for it rather than read it twice.
            // First: mapping the windows makes room, and may evict this very
            // page into a write-back. Looked at the other way round, a page
            // in flight to the store looked mapped, got the zero page, and
            // lost its bytes (1 stress run in 40).
            Counters::add(&self.core.counters.waited_on_fetch, 1);
            self.ahead.finish_fetch(&mut self.core, &mut self.eviction, &mut self.fork);
        }
        if let Some(&slot) = self.eviction.writing.get(&page) {
            match self.eviction.refault_writing(&mut self.core, &mut self.fork, page, slot) {
                // Settled meanwhile: served below by its state.
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                result => return self.finish(page, result),
            }
        }
        debug_assert!(
            !self.eviction.writing.contains_key(&page),
            "page {page} is in flight to the store"
        );
        let missing = !self.core.table.get(page).is_resident();
        let result = match self.core.table.get(page) {
            PageState::Clean | PageState::Dirty => self.already_mapped(page),
            PageState::Empty if self.core.lost.contains(&page) => Err(io::Error::other(
                "its bytes were lost when a failed write-back could not be undone",
            )),
            PageState::Empty => self.zero_fill(page),
            PageState::InStore => self.fill_from_store(page, fault.write),
        };
        if missing && result.is_ok() {
            self.ahead.after_fault(&mut self.core, &mut self.eviction, &mut self.fork, page);
        }
        self.finish(page, result)
    }

    fn finish(&mut self, page: u32, result: io::Result<()>) -> Step {
        self.core.publish_resident();
        match result {
            Ok(()) => Step::Done,
            Err(e) if is_eagain(&e) => Step::Again,
            Err(e) => {
                tracing::error!("fault handler: page {page} could not be mapped: {e}");
                self.core.poison(page)
            }
        }
    }

    /// A write hit a write-protected page. If it is `Clean`, its store copy
    /// goes stale now: mark it dirty before lifting the protection, which
    /// wakes the writer. `Dirty` means another thread's message for the same
    /// page came first. If the page was evicted since, the writer only needs
    /// waking: its retry faults as missing.
    fn write_to_clean(&mut self, page: u32) -> Step {
        // Dirty since before a lazy fork: its child still needs these bytes
        // in the store before the write changes them.
        self.fork.before_write(&mut self.core, page);
        let page_addr = self.core.page_addr(page);
        let state = self.core.table.get(page);
        if state == PageState::Clean {
            self.core.intent.written();
            if self.core.table.written(page) {
                Counters::add(&self.core.counters.prefetch_hits, 1);
            }
            Counters::add(&self.core.counters.write_protect, 1);
        }
        let result = if state.is_resident() {
            retry_eagain(|| self.core.uffd.unprotect(page_addr, PAGE_SIZE))
        } else {
            self.core.uffd.wake(page_addr, PAGE_SIZE)
        };
        match result {
            Ok(()) => Step::Done,
            Err(e) if is_eagain(&e) => Step::Again,
            Err(e) => {
                // The page stays dirty (the safe side); the writer's retry faults again.
                tracing::error!("fault handler: unprotecting page {page} failed: {e}");
                let _ = self.core.uffd.wake(page_addr, PAGE_SIZE);
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
        let page_addr = self.core.page_addr(page);
        match retry_eagain(|| self.core.uffd.zeropage(page_addr, PAGE_SIZE)) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                Counters::add(&self.core.counters.already_mapped, 1);
                self.core.uffd.wake(page_addr, PAGE_SIZE)
            }
            Ok(()) => {
                self.core.table.dirtied(page);
                Ok(())
            }
            other => other,
        }
    }

    /// The page gets its own zeroed page, writable and `Dirty` (the store
    /// holds no current copy). Not the shared zero page, even for a read:
    /// zero-page PTEs written by the program while eviction moved pages
    /// out lost data here (see `prefetch::zero_fill_ahead`), and the page
    /// counts against the budget either way. Eviction's all-zero check
    /// sends it back to `Empty` if it was never written.
    fn zero_fill(&mut self, page: u32) -> io::Result<()> {
        self.eviction.make_room(&mut self.core, &mut self.fork);
        self.record_mapped(page, Fill::Zero, PageState::Dirty);
        let page_addr = self.core.page_addr(page);
        let result = resolve(&self.core.uffd, page_addr, || {
            self.core.uffd.copy(page_addr, &self.core.zero_page, false)
        });
        self.undo_if_failed(page, PageState::Empty, Fill::Zero, result)
    }

    /// A read maps the page write-protected and `Clean`: its store copy is
    /// current until a write faults. A write maps it writable and `Dirty`
    /// at once, sparing the WP fault that would follow; so does a read while
    /// most pages read are written soon after (`intent.rs`).
    /// The bytes come from the compressed pool if it holds the page (the
    /// store holds the same bytes), else from a store read.
    fn fill_from_store(&mut self, page: u32, write: bool) -> io::Result<()> {
        let reading = Instant::now();
        let fill = if self.take_from_pool(page) { Fill::Pool } else { Fill::Store };
        if let Fill::Store = fill {
            let read = self.read_for_fault(page);
            if let Some(pool) = self.core.zpool.as_mut() {
                pool.far_miss(page);
            }
            if let Err(e) = read {
                self.blocks.beside.clear();
                tracing::error!("fault handler: store read of page {page} failed: {e}");
                return match self.core.poison(page) {
                    Step::Done => Ok(()),
                    Step::Again => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
                };
            }
        }
        let c = std::sync::Arc::clone(&self.core.counters);
        let (read_ns, map_ns) = match fill {
            Fill::Pool => (&c.pool_read_ns, &c.pool_map_ns),
            _ => (&c.store_read_ns, &c.store_map_ns),
        };
        let read_took_ns = elapsed_ns(reading);
        Counters::add(read_ns, read_took_ns);
        let rooming = Instant::now();
        self.eviction.make_room(&mut self.core, &mut self.fork);
        let room_took_ns = elapsed_ns(rooming);
        let writable = write || self.writable_fill();
        let now = if writable { PageState::Dirty } else { PageState::Clean };
        self.record_mapped(page, fill, now);
        let page_addr = self.core.page_addr(page);
        let timed = fill.counter(&c).load(Relaxed).is_multiple_of(LATENCY_SAMPLE_EVERY);
        let mapping = Instant::now();
        let bytes = self.core.page_buf.bytes(PAGE_SIZE);
        let (result, woken) = map_page(&self.core.uffd, page_addr, bytes, !writable, timed);
        Counters::add(map_ns, elapsed_ns(mapping));
        if let Some(woken) = woken {
            let parts = [read_took_ns, room_took_ns, ns_between(mapping, woken)];
            record_latency(&c, fill, ns_between(reading, woken), parts);
        }
        self.adapt_pool();
        match result {
            Ok(()) => {
                self.map_beside();
                self.map_riders(reading, timed);
            }
            Err(_) => {
                self.blocks.beside.clear();
                self.blocks.riding.clear();
            }
        }
        self.undo_if_failed(page, PageState::InStore, fill, result)
    }

    /// Decompress `page` into the page buffer if the pool holds it.
    fn take_from_pool(&mut self, page: u32) -> bool {
        let Some(pool) = self.core.zpool.as_mut() else {
            return false;
        };
        pool.take(page, self.core.page_buf.bytes_mut(PAGE_SIZE))
    }

    /// Let the pool resize by the costs measured so far.
    fn adapt_pool(&mut self) {
        let Some(pool) = self.core.zpool.as_mut() else {
            return;
        };
        let c = &self.core.counters;
        let mean = |ns: &AtomicU64, map_ns: &AtomicU64, n: &AtomicU64, guess: u64| {
            let total = ns.load(Relaxed) + map_ns.load(Relaxed);
            total.checked_div(n.load(Relaxed)).unwrap_or(guess)
        };
        let costs = crate::zpool::Costs {
            far_ns: mean(&c.store_read_ns, &c.store_map_ns, &c.from_store, FAR_NS_GUESS),
            pool_ns: mean(&c.pool_read_ns, &c.pool_map_ns, &c.from_pool, POOL_NS_GUESS),
        };
        pool.adapt(&costs);
    }

    /// Whether a page read from the store for a read goes in writable.
    pub(crate) fn writable_fill(&mut self) -> bool {
        let writable = self.core.intent.map_writable();
        Counters::add(&self.core.counters.store_pages_mapped_writable, u64::from(writable));
        writable
    }

    /// Count `page` as mapped before the ioctl that maps it: that ioctl wakes
    /// the faulting thread, which may read the stats at once.
    fn record_mapped(&mut self, page: u32, fill: Fill, now: PageState) {
        if self.core.table.map(page, now) {
            Counters::add(&self.core.counters.ghost_hits, 1);
        }
        Counters::add(fill.counter(&self.core.counters), 1);
        self.core.publish_resident();
    }

    fn undo_if_failed(
        &mut self,
        page: u32,
        was: PageState,
        fill: Fill,
        result: io::Result<()>,
    ) -> io::Result<()> {
        if result.is_err() {
            self.core.table.unmap_newest(page, was);
            fill.counter(&self.core.counters).fetch_sub(1, Relaxed);
        }
        result
    }

    fn read_page(&mut self, page: u32) -> StoreResult<()> {
        let mut ops =
            [ReadOp { page: u64::from(page), buf: self.core.page_buf.bytes_mut(PAGE_SIZE) }];
        let mut last = self.core.store.read(&mut ops);
        for pause in READ_PAUSES {
            if last.is_ok() {
                break;
            }
            std::thread::sleep(pause);
            let mut ops =
                [ReadOp { page: u64::from(page), buf: self.core.page_buf.bytes_mut(PAGE_SIZE) }];
            last = self.core.store.read(&mut ops);
        }
        last
    }

    /// Read `page` into the page buffer for its fault and, if `Neighbours`
    /// says so, the pages of its block that only the store holds into the
    /// block buffer, listed in `beside`, all in one store call. A failed
    /// block read is tried again as the page alone.
    fn read_for_fault(&mut self, page: u32) -> StoreResult<()> {
        self.blocks.beside.clear();
        if let Some((first, len)) = self.blocks.neighbours.miss(page, self.core.budget_pages) {
            let last = (first + len as u32).min(self.core.pages);
            for p in (first..last).filter(|&p| p != page) {
                let only_in_store = self.core.table.get(p) == PageState::InStore
                    && !self.ahead.fetcher.holds(p)
                    && !self.eviction.writing.contains_key(&p);
                if only_in_store {
                    self.blocks.beside.push(p);
                }
            }
        }
        if !self.blocks.beside.is_empty() {
            match self.read_with_beside(page) {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!("fault handler: block read failed ({e}); page alone"),
            }
            self.blocks.beside.clear();
        } else if self.pick_riders(page) {
            match self.read_with_riders(page) {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!("fault handler: shared read failed ({e}); page alone"),
            }
            self.blocks.riding.clear();
        }
        self.read_page(page)
    }

    /// Choose the other faults of this batch whose pages only the store
    /// holds (not on their way in, not being written back, not in the
    /// pool) to read with `page`'s; true if any.
    fn pick_riders(&mut self, page: u32) -> bool {
        self.blocks.riding.clear();
        for i in 0..self.blocks.companions.len() {
            let (p, write) = self.blocks.companions[i];
            let only_in_store = p != page
                && self.core.table.get(p) == PageState::InStore
                && !self.ahead.fetcher.holds(p)
                && !self.eviction.writing.contains_key(&p)
                && !self.core.zpool.as_ref().is_some_and(|pool| pool.holds(p))
                && !self.blocks.riding.iter().any(|&(q, _)| q == p);
            if only_in_store && self.blocks.riding.len() < COMPANIONS_MAX {
                self.blocks.riding.push((p, write));
            }
        }
        self.blocks.riding.sort_unstable();
        !self.blocks.riding.is_empty()
    }

    /// One store read of `page` and the riders' pages, in page order.
    fn read_with_riders(&mut self, page: u32) -> StoreResult<()> {
        let Some(buf) = self.blocks.companion_buf.as_mut() else { return self.read_page(page) };
        let riders = self.blocks.riding.iter().map(|&(p, _)| p);
        let rest = buf.bytes_mut(self.blocks.riding.len() * PAGE_SIZE);
        read_in_order(
            &*self.core.store,
            page,
            self.core.page_buf.bytes_mut(PAGE_SIZE),
            riders,
            rest,
        )
    }

    /// After the faulting page is mapped: map each rider's page as its own
    /// fault would have (the copy wakes its thread; its message, read
    /// already, then finds the page mapped). One that cannot be mapped now
    /// is left to its own message, which reads it again. With `timed`,
    /// each rider's latency is timed as the lead's was (`map_page`).
    fn map_riders(&mut self, reading: Instant, timed: bool) {
        if self.blocks.riding.is_empty() {
            return;
        }
        let riders = std::mem::take(&mut self.blocks.riding);
        let buf = self.blocks.companion_buf.take().expect("a companion buffer when pages rode");
        let bytes = buf.bytes(riders.len() * PAGE_SIZE);
        let mut mapped = 0;
        for (i, &(p, write)) in riders.iter().enumerate() {
            // Nothing between the pick and here maps or writes back a page
            // only the store holds; checked again all the same.
            if self.core.table.get(p) != PageState::InStore
                || self.eviction.writing.contains_key(&p)
            {
                continue;
            }
            self.eviction.make_room(&mut self.core, &mut self.fork);
            let writable = write || self.writable_fill();
            let now = if writable { PageState::Dirty } else { PageState::Clean };
            self.record_mapped(p, Fill::Store, now);
            let addr = self.core.page_addr(p);
            let page_bytes = &bytes[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            let (result, woken) = map_page(&self.core.uffd, addr, page_bytes, !writable, timed);
            if self.undo_if_failed(p, PageState::InStore, Fill::Store, result).is_ok() {
                if let Some(woken) = woken {
                    self.core.counters.store_fault_latency.record_ns(ns_between(reading, woken));
                }
                if let Some(pool) = self.core.zpool.as_mut() {
                    pool.remove(p); // a copy of nothing now that it is mapped
                }
                mapped += 1;
            }
        }
        Counters::add(&self.core.counters.shared_reads, 1);
        Counters::add(&self.core.counters.faults_read_along, mapped);
        self.blocks.companion_buf = Some(buf);
        self.blocks.riding = riders;
        self.blocks.riding.clear();
    }

    /// One store read of `page` and the pages in `beside`, in page order.
    fn read_with_beside(&mut self, page: u32) -> StoreResult<()> {
        let Some(block) = self.blocks.buf.as_mut() else { return self.read_page(page) };
        let beside = self.blocks.beside.iter().copied();
        let rest = block.bytes_mut(self.blocks.beside.len() * PAGE_SIZE);
        read_in_order(
            &*self.core.store,
            page,
            self.core.page_buf.bytes_mut(PAGE_SIZE),
            beside,
            rest,
        )
    }

    /// After the faulting page is mapped (its thread woken): map the pages
    /// read beside it, write-protected, as far as the budget allows.
    fn map_beside(&mut self) {
        if self.blocks.beside.is_empty() {
            return;
        }
        let pages = std::mem::take(&mut self.blocks.beside);
        let block = self.blocks.buf.take().expect("a block buffer when pages were read beside");
        let fit =
            self.ahead.room_for(&mut self.core, &mut self.eviction, &mut self.fork, pages.len());
        Counters::add(&self.core.counters.block_reads, 1);
        Counters::add(&self.core.counters.pages_read_beside, pages.len() as u64);
        self.ahead.map_prefetched(&mut self.core, &pages[..fit], block.bytes(fit * PAGE_SIZE));
        self.blocks.buf = Some(block);
        self.blocks.beside = pages;
        self.blocks.beside.clear();
        self.core.counters.block_pages.store(self.blocks.neighbours.block_pages() as u64, Relaxed);
    }
}

/// One store read of `page` into `own` and of `others` (ascending, without
/// `page`) into consecutive pages of `rest`, all in page order.
fn read_in_order(
    store: &dyn PageStore,
    page: u32,
    own: &mut [u8],
    others: impl Iterator<Item = u32>,
    mut rest: &mut [u8],
) -> StoreResult<()> {
    let mut ops = Vec::with_capacity(READ_BLOCK_PAGES_MAX.max(COMPANIONS_MAX) + 1);
    let mut own = Some(own);
    for p in others {
        if p > page {
            if let Some(buf) = own.take() {
                ops.push(ReadOp { page: u64::from(page), buf });
            }
        }
        let (buf, tail) = std::mem::take(&mut rest).split_at_mut(PAGE_SIZE);
        rest = tail;
        ops.push(ReadOp { page: u64::from(p), buf });
    }
    if let Some(buf) = own.take() {
        ops.push(ReadOp { page: u64::from(page), buf });
    }
    store.read(&mut ops)
}
