//! `Region`: the mapping, its userfaultfd registration and its handler thread.

use crate::discards::Discards;
use crate::error::{FaultError, Result};
use crate::evict::batch::BatchSize;
use crate::evict::writeback::Writer;
use crate::fork::lazy::ForkWritten;
use crate::handler::Handler;
use crate::kernel::doorbell::Doorbell;
use crate::kernel::mem::{Mapping, PageBuf};
use crate::kernel::uffd::Uffd;
use crate::prefetch::fetch::{Fetcher, IN_FLIGHT_MAX};
use crate::prefetch::trend::Trend;
use crate::reserve::HALVES;
use crate::shared::Core;
use crate::state::{PageTable, Policy};
use crate::stats::{Counters, DetailedStats, HandlerStats, RegionStats};
use memlend_store::{PageStore, PAGE_SIZE};
use std::io::PipeWriter;
use std::sync::Arc;
use std::thread::JoinHandle;

/// What a [`Region`] maps and how much of it may be resident.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// Size of the region: a non-zero multiple of 4 KiB, at most 2^32 pages.
    pub size_bytes: usize,
    /// Most pages mapped at once; at least one.
    pub budget_pages: usize,
    /// Pages evicted per batch (one store `write`); `1..=budget_pages`.
    pub evict_batch_pages: usize,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig { size_bytes: 0, budget_pages: 0, evict_batch_pages: 32 }
    }
}

/// How a region chooses victims and (later) prefetches; separate from
/// [`RegionConfig`] so that code naming every `RegionConfig` field keeps
/// compiling. `Region::new` uses `Tuning::default()`.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Victim selection; S3-FIFO unless asked otherwise.
    pub policy: Policy,
    /// Largest aligned block a store fault may read around its page, in
    /// pages (`prefetch/read_block.rs`: used only while it pays; below 2, or with
    /// `prefetch_pages_max` 0, never).
    pub read_block_pages_max: usize,
    /// Largest prefetch window, in pages (0: no prefetch). The window used
    /// is also at most a sixteenth of the budget.
    pub prefetch_pages_max: usize,
    /// When no fault is pending and fewer than this many pages are free
    /// below the budget, the handler evicts a batch ahead of need (0: only
    /// when a fault needs room). `None`: two eviction batches, at most half
    /// the budget.
    pub low_water_pages: Option<usize>,
    /// Before sleeping in poll, the handler polls without sleeping for this
    /// many µs (0: sleep at once). Spinning burns the handler's core.
    pub spin_us: u32,
    /// Map pages read from the store writable when most of them get
    /// written anyway (see `intent.rs`); off: always write-protected.
    pub write_intent: bool,
    /// Along a sequential or strided trend, zero-fill the untouched pages
    /// of the window in one call instead of a fault each.
    pub zero_ahead: bool,
    /// Run the handler on the core of the thread that faults (`kernel/cpu.rs`).
    pub follow_faulter: bool,
    /// Keep evicted pages that compress well in a local pool carved from
    /// the budget (`zpool/mod.rs`), so faults on them need no store read.
    pub compress: bool,
    /// With `compress`: the pool takes every victim that compresses, as
    /// zswap does; off, only victims that were reused (`ZPool::admits`).
    pub pool_admits_all: bool,
    /// With `compress`: how the pool compresses (`codec.rs`).
    pub pool_codec: crate::Codec,
    /// Record every fault in this file (`trace.rs`); see [`Tuning::tracing`].
    pub trace: Option<std::path::PathBuf>,
    /// When one read of the uffd brings several threads' faults on pages
    /// only the store holds, read them all with the first one's store read
    /// (one round trip, not one each) and map them together (`handler/resolve.rs`).
    pub batch_fault_reads: bool,
    /// While every page held fits the budget, collapse 2 MiB chunks whose
    /// pages are all mapped writable into huge pages (`huge.rs`).
    pub huge_pages: bool,
}

impl Tuning {
    /// For taking a page-access trace into `path`: nothing mapped ahead,
    /// every page read mapped write-protected, no pool. Give the region a
    /// budget of [`crate::trace::WINDOW_PAGES`].
    pub fn tracing(path: std::path::PathBuf) -> Tuning {
        Tuning {
            prefetch_pages_max: 0,
            read_block_pages_max: 0,
            write_intent: false,
            zero_ahead: false,
            compress: false,
            huge_pages: false,
            batch_fault_reads: false,
            trace: Some(path),
            ..Tuning::default()
        }
    }
}

/// A budget set while the region runs (`set_budget_pages`) never goes
/// below this. One instruction may need several far pages mapped at once (a
/// copy between two of them, each across a page boundary): with room for
/// fewer, each fault evicts a page the instruction still needs, and it
/// never completes. Seen: redis under `--mem 32M` at a budget of one page,
/// 6.7 M store faults in 6 minutes and not one command answered.
pub const BUDGET_FLOOR_PAGES: usize = 256;

/// ACMS found a 512-page window right for a sequential scan.
const PREFETCH_PAGES_MAX: usize = 512;
/// A prefetch window is at most this share of the budget: with
/// `IN_FLIGHT_MAX` windows and the staging halves (`evict/batch.rs`), the
/// handler's buffers take at most a quarter of it.
const WINDOW_BUDGET_SHARE: usize = 16;

/// The staging halves and the window buffers, all of which may hold pages
/// at once; never more than a quarter of the budget, which they always
/// are unless the budget is under `BUDGET_SHARE_MAX * evict_batch_pages`.
fn reserve_pages(budget_pages: usize, staging_pages: usize, window_pages: usize) -> usize {
    (staging_pages + IN_FLIGHT_MAX * window_pages).min(budget_pages / 4)
}

/// Below this many pages of pool, compression is not worth its overhead.
const POOL_PAGES_MIN: usize = 16;

fn pool_for(
    mapped_pages: usize,
    admits_all: bool,
    codec: crate::Codec,
) -> Result<Option<crate::zpool::ZPool>> {
    let pool_pages = crate::zpool::pool_pages_max(mapped_pages);
    if pool_pages < POOL_PAGES_MIN {
        return Ok(None);
    }
    let pool = crate::zpool::ZPool::new(pool_pages, codec)
        .map_err(FaultError::os("mmap compressed pool"))?;
    Ok(Some(if admits_all { pool.admitting_all() } else { pool }))
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            policy: Policy::default(),
            // Off: on SQLite they cut store faults by 42% and cost 24% of
            // its throughput (`prefetch/read_block.rs`).
            read_block_pages_max: 0,
            prefetch_pages_max: PREFETCH_PAGES_MAX,
            low_water_pages: None,
            spin_us: 0,
            write_intent: true,
            zero_ahead: true,
            follow_faulter: true,
            compress: false,
            pool_admits_all: false,
            pool_codec: crate::Codec::Lz4,
            trace: None,
            huge_pages: true,
            batch_fault_reads: true,
        }
    }
}

/// Anonymous memory backed by a page store beyond `budget_pages` resident.
///
/// Access it through [`Region::as_ptr`]. Dropping the region stops and joins
/// its handler and unmaps the memory: the owner must make sure no thread
/// touches the region after that.
pub struct Region {
    // Field order is drop order: the handler is stopped in `drop` before the
    // mapping goes.
    stop: Option<PipeWriter>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    discards: Arc<Discards>,
    fences: Arc<crate::fences::Fences>,
    reserve_pages: usize,
    bell: Arc<Doorbell>,
    map: Mapping,
    pause: Arc<crate::fork::pause::Pause>,
}

// The owner shares a region between threads (as the preload shim does):
// everything in it is either immutable after `new` or synchronised.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Region>();
};

impl Region {
    pub fn new(config: RegionConfig, store: Arc<dyn PageStore>) -> Result<Region> {
        Region::with_tuning(config, Tuning::default(), store)
    }

    pub fn with_tuning(
        config: RegionConfig,
        tuning: Tuning,
        store: Arc<dyn PageStore>,
    ) -> Result<Region> {
        let pages = check_config(&config, store.info().pages)?;
        let map = Mapping::new(pages as usize).map_err(FaultError::os("mmap region"))?;
        let batch = BatchSize::new(config.evict_batch_pages, config.budget_pages);
        let staging_pages = HALVES * batch.max();
        let window_pages = tuning.prefetch_pages_max.min(config.budget_pages / WINDOW_BUDGET_SHARE);
        let spare_bufs = (0..if window_pages > 0 { IN_FLIGHT_MAX } else { 0 })
            .map(|_| PageBuf::new(window_pages))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(FaultError::os("mmap prefetch buffers"))?;
        // No prefetch means nothing read ahead of a fault, blocks included.
        let block_pages = match tuning.prefetch_pages_max {
            0 => 0,
            _ => tuning.read_block_pages_max,
        };
        let blocks =
            crate::prefetch::read_block::Blocks::new(block_pages, tuning.batch_fault_reads)
                .map_err(FaultError::os("mmap block buffer"))?;
        let reserve_pages = reserve_pages(config.budget_pages, staging_pages, window_pages);
        let staging =
            Arc::new(Mapping::new(staging_pages).map_err(FaultError::os("mmap staging"))?);
        let uffd = Uffd::open_region().map_err(FaultError::os("open userfaultfd"))?;
        uffd.register(map.addr(), map.len_bytes(), true)
            .map_err(FaultError::os("register region"))?;
        let staging_uffd = Uffd::open_staging().map_err(FaultError::os("open userfaultfd"))?;
        staging_uffd
            .register(staging.addr(), staging.len_bytes(), false)
            .map_err(FaultError::os("register staging"))?;
        let bell = Arc::new(Doorbell::new().map_err(FaultError::os("eventfd"))?);
        let zpool = match tuning.compress {
            true => pool_for(
                config.budget_pages - reserve_pages,
                tuning.pool_admits_all,
                tuning.pool_codec,
            )?,
            false => None,
        };
        let packer = zpool
            .as_ref()
            .map(crate::zpool::ZPool::packer)
            .transpose()
            .map_err(FaultError::os("make the compressor"))?;
        let writer =
            Writer::start(Arc::clone(&store), Arc::clone(&staging), Arc::clone(&bell), packer)
                .map_err(FaultError::os("spawn write-back thread"))?;
        let fetcher = Fetcher::start(Arc::clone(&store), &bell)
            .map_err(FaultError::os("spawn fetch thread"))?;
        let trace = match &tuning.trace {
            Some(path) => Some(
                crate::trace::Trace::create(path).map_err(FaultError::os("create the trace"))?,
            ),
            None => None,
        };
        let counters = Arc::new(Counters::default());
        counters
            .budget_pages
            .store(config.budget_pages as u64, std::sync::atomic::Ordering::Relaxed);
        let discards = Arc::new(Discards::default());
        let fences = Arc::new(crate::fences::Fences::new(pages));
        let reserve = crate::reserve::Reserve::new(reserve_pages, batch.pages());
        counters.reserve_pages.store(reserve.pages() as u64, std::sync::atomic::Ordering::Relaxed);
        let eviction = crate::evict::Eviction {
            staging,
            writer,
            writing: std::collections::HashMap::with_capacity(staging_pages),
            victims: Vec::with_capacity(batch.max()),
            batch,
            low_water_pages: tuning
                .low_water_pages
                .unwrap_or(2 * config.evict_batch_pages)
                .min(config.budget_pages / 2),
            headroom_stalled: false,
            failures: Default::default(),
            clean_only: false,
            unmovable_said: false,
        };
        let ahead = crate::prefetch::Ahead {
            fetcher,
            trend: Trend::new(window_pages),
            zero_ahead: tuning.zero_ahead,
            window_pages: Vec::new(),
            spare_bufs,
            zero_ahead_pages: Vec::new(),
            zero_run: Vec::new(),
        };
        let huge = match tuning.huge_pages {
            true => crate::huge::Huge::start(map.addr(), pages, Arc::clone(&counters))
                .map_err(FaultError::os("spawn huge-page thread"))?,
            false => None,
        };
        let core = Core {
            uffd,
            staging_uffd,
            base: map.addr(),
            pages,
            table: PageTable::new(pages, config.budget_pages, tuning.policy),
            store,
            counters: counters.clone(),
            discards: discards.clone(),
            fences: fences.clone(),
            budget_pages: config.budget_pages,
            reserve,
            bell: Arc::clone(&bell),
            page_buf: PageBuf::new(1).map_err(FaultError::os("mmap page buffer"))?,
            zero_page: vec![0; PAGE_SIZE],
            intent: crate::intent::WriteIntent::new(tuning.write_intent),
            zpool,
            lost: Default::default(),
            trace,
        };
        let pause = Arc::new(crate::fork::pause::Pause::default());
        let handler = Handler {
            core,
            eviction,
            ahead,
            blocks,
            huge,
            deferred: Vec::new(),
            spin: std::time::Duration::from_micros(u64::from(tuning.spin_us)),
            follow: crate::kernel::cpu::Follow::new(tuning.follow_faulter),
            recent_gap: std::time::Duration::ZERO,
            pause: Arc::clone(&pause),
            fork: crate::fork::Forks::default(),
        };
        let (stop_rx, stop_tx) = std::io::pipe().map_err(FaultError::os("stop pipe"))?;
        let thread = std::thread::Builder::new()
            .name("memlend-fault".into())
            .spawn(move || handler.run(stop_rx))
            .map_err(FaultError::os("spawn fault handler"))?;
        Ok(Region {
            stop: Some(stop_tx),
            thread: Some(thread),
            counters,
            discards,
            fences,
            reserve_pages,
            bell,
            map,
            pause,
        })
    }

    /// Start of the region. Valid for reads and writes of `len()` bytes
    /// until the region is dropped.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.addr() as *mut u8
    }

    pub fn len(&self) -> usize {
        self.map.len_bytes()
    }

    /// Copies of this process's own pages for the child of the fork whose
    /// pause was number `number` (`Paused::number`): `fork/copy.rs`.
    pub fn parent_copy(&self, number: u64) -> std::io::Result<crate::ParentCopy> {
        let pages = (self.len() / PAGE_SIZE) as u32;
        crate::ParentCopy::new(self.map.addr(), pages, Arc::clone(&self.pause), number)
    }

    /// Never true: a region has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Pages of the budget kept back for the handler's own buffers (the
    /// staging halves and the prefetch windows) while the region holds more
    /// pages than its budget: then at most `budget - reserved` are mapped,
    /// so mapped, staged and prefetched pages together stay within the
    /// budget. A region whose pages all fit maps them all. It follows what
    /// the buffers hold or may take next (`reserve.rs`), as of the handler's
    /// last turn, and never exceeds [`Region::reserved_pages_max`].
    pub fn reserved_pages(&self) -> usize {
        self.counters.reserve_pages.load(std::sync::atomic::Ordering::Relaxed) as usize
    }

    /// Of [`Region::reserved_pages`], the pages the buffers hold now (the
    /// rest of it is room kept for them): what the process's memory holds
    /// for them, as of the handler's last turn.
    pub fn reserve_held_pages(&self) -> usize {
        self.counters.reserve_held_pages.load(std::sync::atomic::Ordering::Relaxed) as usize
    }

    /// The most [`Region::reserved_pages`] can be: every buffer at its
    /// largest, at most a quarter of the configured budget.
    pub fn reserved_pages_max(&self) -> usize {
        self.reserve_pages
    }

    pub fn stats(&self) -> RegionStats {
        self.counters.snapshot()
    }

    /// [`Region::stats`] plus the event counters (free, munmap, madvise).
    pub fn detailed_stats(&self) -> DetailedStats {
        self.counters.detailed()
    }

    /// Replacement, prefetch, eviction-ahead and failure counters.
    pub fn handler_stats(&self) -> HandlerStats {
        self.counters.handler()
    }

    /// Change the budget (as `RegionConfig::budget_pages`), for an owner
    /// that follows the memory the rest of its process uses. The handler
    /// takes it at its next turn, woken now; going down, it evicts to the
    /// new budget. It never goes below twice the reserved pages (the
    /// handler's buffers must fit with room for mapped pages).
    pub fn set_budget_pages(&self, budget_pages: usize) {
        let budget_pages = budget_pages.max(2 * self.reserve_pages).max(BUDGET_FLOOR_PAGES);
        self.counters
            .budget_target_pages
            .store(budget_pages as u64, std::sync::atomic::Ordering::Relaxed);
        self.bell.ring();
    }

    /// Hold the handler still for a fork: when this returns, every write-back
    /// and fetch has finished, nothing moves in or out of the region until
    /// the returned guard is dropped, and the guard lists the pages whose
    /// bytes only the store holds (the others are mapped, or read as zero).
    /// Faults meanwhile wait. Fails if the handler is gone.
    pub fn pause(&self) -> Result<Paused<'_>> {
        self.pause_as(false)
    }

    /// `pause`, but the dirty pages are not written before the fork: they
    /// are write-protected and listed as pending (`Paused::pending_bits`),
    /// the child shares them, and the handler writes them after the pause,
    /// between faults, telling the sink given to `Paused::clean_lazily` as
    /// each lands ("Forked children" in DESIGN.md). Without a sink they
    /// stay dirty and the child keeps sharing them.
    pub fn pause_lazy(&self) -> Result<Paused<'_>> {
        self.pause_as(true)
    }

    fn pause_as(&self, lazy: bool) -> Result<Paused<'_>> {
        let number = self.pause.ask(lazy);
        self.bell.ring();
        let alive = || self.thread.as_ref().is_some_and(|t| !t.is_finished());
        match self.pause.wait_parked(alive) {
            Some(lists) => Ok(Paused {
                region: self,
                in_store: lists.in_store,
                pending: lists.pending,
                number,
            }),
            None => Err(FaultError::Config("the fault handler is not running".into())),
        }
    }

    /// Make the handler fail as if it had panicked, at its next turn (the
    /// next message, or within a second): for tests of the failure path.
    #[doc(hidden)]
    pub fn fail_handler_for_tests(&self) {
        self.counters.fail_requested.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Free `len_bytes` at `offset_bytes` (both whole pages, inside the
    /// region): when this returns the range reads zero, costs no resident
    /// budget and holds nothing in the store. It is madvise(MADV_DONTNEED);
    /// the handler, told by the REMOVE event, forgets the pages and discards
    /// their store copies. Safe to call from any thread, even while others
    /// touch other pages (or these: they read old bytes or zero).
    pub fn discard(&self, offset_bytes: usize, len_bytes: usize) -> Result<()> {
        check_range(offset_bytes, len_bytes, self.len())?;
        if len_bytes == 0 {
            return Ok(());
        }
        let start = self.map.addr() + offset_bytes;
        let listed = self.discards.begin(start, start + len_bytes);
        let result = self.map.discard(offset_bytes, len_bytes);
        if listed {
            self.discards.finish(start, start + len_bytes);
        }
        result.map_err(FaultError::os("madvise(MADV_DONTNEED)"))
    }
}

impl Region {
    /// The owner made `offset_bytes..+len_bytes` inaccessible (`fenced`:
    /// PROT_NONE) or accessible again: nothing is mapped there ahead of a
    /// fault while it is fenced (`fences.rs`).
    pub fn fence(&self, offset_bytes: usize, len_bytes: usize, fenced: bool) -> Result<()> {
        check_range(offset_bytes, len_bytes, self.len())?;
        let (first, count) = (offset_bytes / PAGE_SIZE, len_bytes / PAGE_SIZE);
        self.fences.set(first as u32, count as u32, fenced);
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Closing the pipe's write end wakes the handler's poll with POLLHUP.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("fault handler panicked while failing safe");
            }
        }
    }
}

/// `offset_bytes..offset_bytes + len_bytes` is whole pages inside `region_bytes`.
fn check_range(offset_bytes: usize, len_bytes: usize, region_bytes: usize) -> Result<()> {
    let aligned = offset_bytes.is_multiple_of(PAGE_SIZE) && len_bytes.is_multiple_of(PAGE_SIZE);
    let inside = offset_bytes.checked_add(len_bytes).is_some_and(|end| end <= region_bytes);
    if !aligned || !inside {
        return Err(FaultError::Range(format!(
            "{offset_bytes:#x}+{len_bytes:#x} is not whole pages inside the region \
             ({region_bytes:#x} bytes)"
        )));
    }
    Ok(())
}

/// The region's page count, once the config and store size are checked.
fn check_config(config: &RegionConfig, store_pages: u64) -> Result<u32> {
    let bad = |why: String| Err(FaultError::Config(why));
    if config.size_bytes == 0 || !config.size_bytes.is_multiple_of(PAGE_SIZE) {
        return bad(format!("size {} is not whole pages", config.size_bytes));
    }
    let Ok(pages) = u32::try_from(config.size_bytes / PAGE_SIZE) else {
        return bad(format!("size {} is over 2^32 pages", config.size_bytes));
    };
    if config.budget_pages == 0 {
        return bad("budget is zero pages".into());
    }
    if config.evict_batch_pages == 0 || config.evict_batch_pages > config.budget_pages {
        return bad(format!(
            "eviction batch {} is not in 1..={}",
            config.evict_batch_pages, config.budget_pages
        ));
    }
    if store_pages < u64::from(pages) {
        return bad(format!("store has {store_pages} pages, region {pages}"));
    }
    Ok(pages)
}

/// The handler held still (`Region::pause`) until this is dropped.
pub struct Paused<'a> {
    region: &'a Region,
    /// One bit a page: set if the store holds its bytes (`InStore`, or
    /// mapped `Clean`).
    in_store: Vec<u64>,
    /// One bit a page: dirty pages a lazy clean writes after the pause.
    pending: Vec<u64>,
    /// Which pause of this region this is (the first is 1).
    number: u64,
}

impl Paused<'_> {
    /// Which pause of this region this is (the first is 1): what a
    /// `ParentCopy` for this fork's child is made with.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Whether the store held page `page`'s bytes when the handler parked
    /// (the page may be mapped as well, unchanged since).
    pub fn in_store(&self, page: u64) -> bool {
        self.in_store.get((page / 64) as usize).is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// The pages in the store, one bit a page (bit `p % 64` of word `p / 64`).
    pub fn in_store_bits(&self) -> &[u64] {
        &self.in_store
    }

    /// The pages a lazy pause left dirty and write-protected, one bit a
    /// page: the child shares them until `sink` says they are written.
    /// Empty (all zero) for `Region::pause`.
    pub fn pending_bits(&self) -> &[u64] {
        &self.pending
    }

    /// After `Region::pause_lazy`: tell `sink` which pending pages are
    /// written, as they land. Called before the pause ends.
    pub fn clean_lazily(&self, sink: Box<dyn ForkWritten>) {
        self.region.pause.set_sink(sink);
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.region.pause.end();
    }
}
