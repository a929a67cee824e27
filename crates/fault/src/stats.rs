//! Region counters: relaxed atomics, written by the handler thread, read by
//! anyone. Each counter is exact; two may disagree by a fault in flight.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub(crate) struct Counters {
    pub zero_filled: AtomicU64,
    pub from_store: AtomicU64,
    pub already_mapped: AtomicU64,
    pub eviction_batches: AtomicU64,
    pub pages_written_back: AtomicU64,
    pub pages_zero_dropped: AtomicU64,
    pub pages_clean_dropped: AtomicU64,
    pub write_protect: AtomicU64,
    pub pages_poisoned: AtomicU64,
    pub pages_resident: AtomicU64,
    pub remove_events: AtomicU64,
    pub unmap_events: AtomicU64,
    pub remap_events: AtomicU64,
    pub pages_discarded: AtomicU64,
    pub store_discard_failures: AtomicU64,
    pub faults_deferred: AtomicU64,
    pub ghost_hits: AtomicU64,
    pub pages_prefetched: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub prefetch_wasted: AtomicU64,
    pub eviction_batches_ahead: AtomicU64,
    pub evictions_on_fault: AtomicU64,
    pub pages_unshared: AtomicU64,
    pub pages_unshared_ahead: AtomicU64,
    pub forks: AtomicU64,
    pub pages_cleaned_for_fork: AtomicU64,
    pub pages_cleaned_after_fork: AtomicU64,
    pub fork_pause_ns: AtomicU64,
    pub fork_pause_evict_ns: AtomicU64,
    pub fork_pause_dirty_ns: AtomicU64,
    pub pages_zeroed_ahead: AtomicU64,
    pub from_staging: AtomicU64,
    pub waited_on_fetch: AtomicU64,
    pub handler_moves: AtomicU64,
    pub prefetch_reads: AtomicU64,
    pub block_reads: AtomicU64,
    pub pages_read_beside: AtomicU64,
    pub block_pages: AtomicU64,
    pub shared_reads: AtomicU64,
    pub faults_read_along: AtomicU64,
    pub huge_collapsed: AtomicU64,
    pub huge_failed: AtomicU64,
    pub huge_failures_in_a_row: AtomicU64,
    pub store_pages_mapped_writable: AtomicU64,
    pub handler_failures: AtomicU64,
    pub store_read_ns: AtomicU64,
    pub store_map_ns: AtomicU64,
    pub from_pool: AtomicU64,
    pub staging_waits: AtomicU64,
    pub staging_wait_ns: AtomicU64,
    pub pool_read_ns: AtomicU64,
    pub pool_map_ns: AtomicU64,
    /// The compressed pool's own figures, published by the handler.
    pub pool_pages_stored: AtomicU64,
    pub pool_pages_incompressible: AtomicU64,
    pub pool_pages_skipped: AtomicU64,
    pub pool_pages_dropped: AtomicU64,
    pub pool_ghost_hits: AtomicU64,
    pub pool_pages_held: AtomicU64,
    pub pool_bytes_held: AtomicU64,
    pub pool_charged_pages: AtomicU64,
    pub pool_limit_pages: AtomicU64,
    /// Faults from the store and from the pool, message read to wake.
    pub store_fault_latency: crate::latency::Histogram,
    pub pool_fault_latency: crate::latency::Histogram,
    /// The three parts of a fault from the store, so that a tail can be
    /// put down to one: the read, making room (eviction on the fault's
    /// path), the map.
    pub store_read_latency: crate::latency::Histogram,
    pub store_room_latency: crate::latency::Histogram,
    pub store_map_latency: crate::latency::Histogram,
    /// The budget asked for by `Region::set_budget_pages` (0: as configured),
    /// and the budget in force.
    pub budget_target_pages: AtomicU64,
    pub budget_pages: AtomicU64,
    /// The budget kept back for the handler's buffers now (`reserve.rs`),
    /// and the pages they hold of it.
    pub reserve_pages: AtomicU64,
    pub reserve_held_pages: AtomicU64,
    /// Set by `Region::fail_handler_for_tests`: the handler panics at its
    /// next turn.
    pub fail_requested: std::sync::atomic::AtomicBool,
}

/// A snapshot of [`crate::Region::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Faults answered with a zero page, with no store I/O.
    pub faults_zero_filled: u64,
    /// Faults answered by one store read and UFFDIO_COPY.
    pub faults_from_store: u64,
    /// Fault messages for pages already mapped by then (a thread racing
    /// another on one page): woken, nothing else.
    pub faults_already_mapped: u64,
    /// Eviction batches, each at most one store `write` (none if every
    /// victim was clean or all zeroes).
    pub eviction_batches: u64,
    /// Pages written to the store by evictions.
    pub pages_written_back: u64,
    /// Evicted pages that were all zeroes: dropped, not written; the next
    /// touch zero-fills them without store I/O.
    pub pages_zero_dropped: u64,
    /// Evicted pages not written since they came from the store, whose
    /// copy is still current: dropped, not written.
    pub pages_clean_dropped: u64,
    /// First writes to clean (write-protected) pages: each one a WP fault,
    /// answered by marking the page dirty and lifting the protection.
    pub faults_write_protect: u64,
    /// Pages whose store read failed, poisoned so the accessor gets SIGBUS.
    pub pages_poisoned: u64,
    /// Pages mapped in the region now.
    pub pages_resident: u64,
}

/// Counters beyond [`RegionStats`] (kept separate so that code destructuring
/// `RegionStats` keeps compiling): events and their effects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetailedStats {
    pub basic: RegionStats,
    /// REMOVE events: madvise(MADV_DONTNEED/MADV_REMOVE/MADV_FREE) of
    /// region memory, including every [`crate::Region::discard`].
    pub remove_events: u64,
    /// UNMAP events: munmap of region memory by its owner.
    pub unmap_events: u64,
    /// REMAP events: mremap moved region memory (unsupported; logged).
    pub remap_events: u64,
    /// Region pages inside REMOVE/UNMAP ranges: now `Empty` (or, for an
    /// madvise other than `Region::discard`, `Dirty` if still mapped), their
    /// store copies discarded.
    pub pages_discarded: u64,
    /// Store discards that failed (best effort; logged).
    pub store_discard_failures: u64,
    /// Faults put off because the kernel refused to map while an event was
    /// queued (EAGAIN), then served after reading it.
    pub faults_deferred: u64,
}

/// Counters of replacement, prefetch, eviction ahead and handler failure,
/// from [`crate::Region::handler_stats`]. Kept out of [`DetailedStats`],
/// which code elsewhere destructures field by field, and non-exhaustive so
/// that adding a counter here breaks no one.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandlerStats {
    /// Faults on pages evicted recently (in the ghost ring): evicted too
    /// early, so S3-FIFO puts them straight into its main queue.
    pub ghost_hits: u64,
    /// Pages read ahead of a fault along a detected trend and mapped clean.
    pub pages_prefetched: u64,
    /// Prefetched pages later used: a write faulted on one, or the faulting
    /// stream moved past it while it was mapped (reads of a mapped page
    /// raise nothing, so this is inferred from the next fault).
    pub prefetch_hits: u64,
    /// Prefetched pages evicted before either happened.
    pub prefetch_wasted: u64,
    /// Eviction batches run while no fault was pending, to keep a margin
    /// free below the budget (also counted in `eviction_batches` if they
    /// wrote anything).
    pub eviction_batches_ahead: u64,
    /// Eviction batches a fault waited for: no free page when it was read.
    pub evictions_on_fault: u64,
    /// Pages a fork had shared with a child, written to so that they could
    /// move out (`evict/moveout.rs`).
    pub pages_unshared: u64,
    /// Pages a fork had shared, unshared a batch at a time before eviction
    /// moved them out, keeping their protection and state (`fork/unshare.rs`).
    pub pages_unshared_ahead: u64,
    /// Times the handler parked for a fork (`Region::pause`).
    pub forks: u64,
    /// `Dirty` pages written to the store for a fork, so that the child
    /// need not share them (`fork/clean.rs`), before or after it.
    pub pages_cleaned_for_fork: u64,
    /// Of those, the pages a lazy clean wrote after its fork
    /// (`fork/lazy.rs`).
    pub pages_cleaned_after_fork: u64,
    /// Time the handler spent getting ready for forks (settling, writing
    /// dirty pages out, making room), faults waiting meanwhile.
    pub fork_pause_ns: u64,
    /// Of `fork_pause_ns`: evicting down to the budget lowered for the child.
    pub fork_pause_evict_ns: u64,
    /// Of `fork_pause_ns`: the dirty pages, written (eager) or
    /// write-protected (lazy).
    pub fork_pause_dirty_ns: u64,
    /// Untouched pages zero-filled along a trend, ahead of their fault.
    pub pages_zeroed_ahead: u64,
    /// Faults on pages whose write-back was still in flight, served from
    /// the staging copy with no store read.
    pub faults_from_staging: u64,
    /// Prefetch windows handed to the fetch thread (one store read each).
    pub prefetch_reads: u64,
    /// Store faults that read the aligned block around their page
    /// (`prefetch/read_block.rs`), the other pages of those blocks read and mapped (also
    /// in `pages_prefetched`), and the block size in use now (1: none).
    pub block_reads: u64,
    pub pages_read_beside: u64,
    pub block_pages: u64,
    /// Store reads that also read other threads' faulting pages (from the
    /// same read of the uffd), and those faults, each mapped with them
    /// (also counted in `faults_from_store`).
    pub shared_reads: u64,
    pub faults_read_along: u64,
    /// 2 MiB chunks collapsed into huge pages while every page held fit
    /// the budget, and collapses that failed (`huge.rs`).
    pub huge_collapsed: u64,
    pub huge_failed: u64,
    /// Faults on pages of a prefetch window still being read: the faulting
    /// thread waited for that read instead of making its own.
    pub faults_waited_on_fetch: u64,
    /// Pages read from the store (by a read fault or prefetch) and mapped
    /// writable, because most such pages were being written (`intent.rs`).
    pub store_pages_mapped_writable: u64,
    /// Times the handler moved to another core, following the faulting
    /// threads (`kernel/cpu.rs`).
    pub handler_moves: u64,
    /// 1 once the handler has failed (panicked, or poll/read on the uffd
    /// failed): every page not mapped then was poisoned (SIGBUS on touch);
    /// the reason is logged.
    pub handler_failures: u64,
    /// Nanoseconds that faults from the store spent in their store read
    /// (network and decryption included), summed: over
    /// `faults_from_store`, the mean read.
    pub fault_store_read_ns: u64,
    /// The same for mapping the page read: the UFFDIO_COPY call, wall
    /// time. It wakes the faulting thread, which shares the handler's core
    /// (`kernel/cpu.rs`) and may run first: of 4.8 µs measured, 2.5 µs were the
    /// handler's own CPU time.
    pub fault_map_ns: u64,
    /// Faults served from the compressed pool: a decompression and
    /// UFFDIO_COPY, no store read.
    pub faults_from_pool: u64,
    /// Nanoseconds those faults spent decompressing, and mapping.
    pub fault_pool_read_ns: u64,
    pub fault_pool_map_ns: u64,
    /// The compressed pool: pages put in, pages that did not compress
    /// (store only), entries dropped for room, faults on pages it had
    /// dropped lately, pages and compressed bytes held now, memory charged
    /// against the budget now and the most it may take now (pages).
    pub pool_pages_stored: u64,
    pub pool_pages_incompressible: u64,
    /// Victims not compressed while the pool was at its smallest.
    pub pool_pages_skipped: u64,
    pub pool_pages_dropped: u64,
    pub pool_ghost_hits: u64,
    pub pool_pages_held: u64,
    pub pool_bytes_held: u64,
    pub pool_charged_pages: u64,
    pub pool_limit_pages: u64,
    /// A fault served by a store read, from the handler reading its message
    /// to the wake of the faulting thread (the kernel's delivery of the
    /// message before that is not in it, nor the wake's own µs):
    /// percentiles in ns of one fault in eight (`resolve::map_page`), 0
    /// before the first. Misses only: hits on mapped pages raise no fault
    /// and are never in it.
    pub fault_store_latency_ns_p50: u64,
    pub fault_store_latency_ns_p99: u64,
    pub fault_store_latency_ns_p999: u64,
    /// The budget in force (`Region::set_budget_pages` changes it).
    pub budget_pages: u64,
    /// Of it, kept back for the handler's buffers now (`reserve.rs`).
    pub reserve_pages: u64,
    /// Evictions that found both staging halves held by write-back jobs
    /// and waited for one, and the nanoseconds they waited in all.
    pub staging_waits: u64,
    pub staging_wait_ns: u64,
    /// The same for faults served from the compressed pool.
    pub fault_pool_latency_ns_p50: u64,
    pub fault_pool_latency_ns_p99: u64,
    pub fault_pool_latency_ns_p999: u64,
    /// p99 of each part of a timed fault from the store (its store read,
    /// making room for it, mapping it up to the wake): which one the whole
    /// fault's tail is.
    pub fault_store_read_ns_p99: u64,
    pub fault_room_ns_p99: u64,
    pub fault_map_ns_p99: u64,
}

impl HandlerStats {
    /// Mean µs of a fault from the store in its read and in its map, over
    /// `faults` of them; None before the first.
    pub fn fault_parts_us(&self, faults: u64) -> Option<(f64, f64)> {
        let per = |ns: u64| ns as f64 / faults as f64 / 1000.0;
        (faults > 0).then(|| (per(self.fault_store_read_ns), per(self.fault_map_ns)))
    }
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn publish_pool(&self, pool: &crate::zpool::PoolStats) {
        let set = |counter: &AtomicU64, v: u64| counter.store(v, Relaxed);
        set(&self.pool_pages_stored, pool.pages_stored);
        set(&self.pool_pages_incompressible, pool.pages_incompressible);
        set(&self.pool_pages_skipped, pool.pages_skipped);
        set(&self.pool_pages_dropped, pool.pages_dropped);
        set(&self.pool_ghost_hits, pool.ghost_hits);
        set(&self.pool_pages_held, pool.pages_held);
        set(&self.pool_bytes_held, pool.bytes_held);
        set(&self.pool_charged_pages, pool.charged_pages);
        set(&self.pool_limit_pages, pool.limit_pages);
    }

    pub fn snapshot(&self) -> RegionStats {
        RegionStats {
            faults_zero_filled: self.zero_filled.load(Relaxed),
            faults_from_store: self.from_store.load(Relaxed),
            faults_already_mapped: self.already_mapped.load(Relaxed),
            eviction_batches: self.eviction_batches.load(Relaxed),
            pages_written_back: self.pages_written_back.load(Relaxed),
            pages_zero_dropped: self.pages_zero_dropped.load(Relaxed),
            pages_clean_dropped: self.pages_clean_dropped.load(Relaxed),
            faults_write_protect: self.write_protect.load(Relaxed),
            pages_poisoned: self.pages_poisoned.load(Relaxed),
            pages_resident: self.pages_resident.load(Relaxed),
        }
    }

    pub fn handler(&self) -> HandlerStats {
        HandlerStats {
            ghost_hits: self.ghost_hits.load(Relaxed),
            pages_prefetched: self.pages_prefetched.load(Relaxed),
            prefetch_hits: self.prefetch_hits.load(Relaxed),
            prefetch_wasted: self.prefetch_wasted.load(Relaxed),
            eviction_batches_ahead: self.eviction_batches_ahead.load(Relaxed),
            evictions_on_fault: self.evictions_on_fault.load(Relaxed),
            pages_unshared: self.pages_unshared.load(Relaxed),
            pages_unshared_ahead: self.pages_unshared_ahead.load(Relaxed),
            forks: self.forks.load(Relaxed),
            pages_cleaned_for_fork: self.pages_cleaned_for_fork.load(Relaxed),
            pages_cleaned_after_fork: self.pages_cleaned_after_fork.load(Relaxed),
            fork_pause_ns: self.fork_pause_ns.load(Relaxed),
            fork_pause_evict_ns: self.fork_pause_evict_ns.load(Relaxed),
            fork_pause_dirty_ns: self.fork_pause_dirty_ns.load(Relaxed),
            pages_zeroed_ahead: self.pages_zeroed_ahead.load(Relaxed),
            faults_from_staging: self.from_staging.load(Relaxed),
            faults_waited_on_fetch: self.waited_on_fetch.load(Relaxed),
            prefetch_reads: self.prefetch_reads.load(Relaxed),
            block_reads: self.block_reads.load(Relaxed),
            pages_read_beside: self.pages_read_beside.load(Relaxed),
            block_pages: self.block_pages.load(Relaxed),
            shared_reads: self.shared_reads.load(Relaxed),
            faults_read_along: self.faults_read_along.load(Relaxed),
            huge_collapsed: self.huge_collapsed.load(Relaxed),
            huge_failed: self.huge_failed.load(Relaxed),
            store_pages_mapped_writable: self.store_pages_mapped_writable.load(Relaxed),
            handler_moves: self.handler_moves.load(Relaxed),
            handler_failures: self.handler_failures.load(Relaxed),
            fault_store_read_ns: self.store_read_ns.load(Relaxed),
            fault_map_ns: self.store_map_ns.load(Relaxed),
            faults_from_pool: self.from_pool.load(Relaxed),
            fault_pool_read_ns: self.pool_read_ns.load(Relaxed),
            fault_pool_map_ns: self.pool_map_ns.load(Relaxed),
            pool_pages_stored: self.pool_pages_stored.load(Relaxed),
            pool_pages_incompressible: self.pool_pages_incompressible.load(Relaxed),
            pool_pages_skipped: self.pool_pages_skipped.load(Relaxed),
            pool_pages_dropped: self.pool_pages_dropped.load(Relaxed),
            pool_ghost_hits: self.pool_ghost_hits.load(Relaxed),
            pool_pages_held: self.pool_pages_held.load(Relaxed),
            pool_bytes_held: self.pool_bytes_held.load(Relaxed),
            pool_charged_pages: self.pool_charged_pages.load(Relaxed),
            pool_limit_pages: self.pool_limit_pages.load(Relaxed),
            budget_pages: self.budget_pages.load(Relaxed),
            reserve_pages: self.reserve_pages.load(Relaxed),
            staging_waits: self.staging_waits.load(Relaxed),
            staging_wait_ns: self.staging_wait_ns.load(Relaxed),
            fault_store_latency_ns_p50: self.store_fault_latency.quantile_ns(0.50),
            fault_store_latency_ns_p99: self.store_fault_latency.quantile_ns(0.99),
            fault_store_latency_ns_p999: self.store_fault_latency.quantile_ns(0.999),
            fault_pool_latency_ns_p50: self.pool_fault_latency.quantile_ns(0.50),
            fault_pool_latency_ns_p99: self.pool_fault_latency.quantile_ns(0.99),
            fault_pool_latency_ns_p999: self.pool_fault_latency.quantile_ns(0.999),
            fault_store_read_ns_p99: self.store_read_latency.quantile_ns(0.99),
            fault_room_ns_p99: self.store_room_latency.quantile_ns(0.99),
            fault_map_ns_p99: self.store_map_latency.quantile_ns(0.99),
        }
    }

    pub fn detailed(&self) -> DetailedStats {
        DetailedStats {
            basic: self.snapshot(),
            remove_events: self.remove_events.load(Relaxed),
            unmap_events: self.unmap_events.load(Relaxed),
            remap_events: self.remap_events.load(Relaxed),
            pages_discarded: self.pages_discarded.load(Relaxed),
            store_discard_failures: self.store_discard_failures.load(Relaxed),
            faults_deferred: self.faults_deferred.load(Relaxed),
        }
    }
}
