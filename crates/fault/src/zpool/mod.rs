//! The compressed local tier. Pages leaving the resident set are kept here,
//! compressed (lz4, or zstd: `memlend_store::codec`), in memory carved from the same budget, so a fault on one
//! costs a decompression (about a microsecond) instead of a store read.
//!
//! Write-through: a page enters only once the store holds its bytes (a clean
//! victim at once, a dirty one when its write-back lands), so an entry is a
//! cache of the store's copy and dropping one loses nothing. An entry exists
//! only while its page is `InStore`: a fault takes it out (the pool and the
//! resident set never hold the same page), and prefetch and discards drop it.
//!
//! Memory: an arena of 256-byte chunks; a page's bytes are a chain of
//! chunks, allocated lowest first so that the arena stays dense at its
//! bottom. The pool is charged for the arena pages up to the highest chunk
//! used since the last trim (`top_pages`), never more than its limit.
//! Lowering the limit drops the entries above it and gives their pages back.
//!
//! Compression (about 6 µs of CPU a page here, against 2 µs to decompress)
//! runs on the write-back thread (`Packer`), not on the fault path; when
//! nearly every page lately failed to compress, it tries one in eight. Only
//! victims that were reused (`admits`) are offered, unless told otherwise.
//!
//! Which pages leave the pool: the oldest entry first (FIFO). How big the
//! pool may be: `adapt` weighs, per page of memory, the store reads a
//! bigger pool would have saved (faults on pages dropped from it lately)
//! against the pool hits a bigger resident set would have saved (hits on
//! the newest entries), each at its measured cost, and moves the limit a
//! step towards the better use. Pages that do not compress (over
//! `KEEP_BYTES_MAX`) never enter, so incompressible data leaves the pool
//! empty and the whole budget resident.

use crate::kernel::mem::PageBuf;
use memlend_store::codec::{packed_bytes_max, Codec, Engine};
use memlend_store::PAGE_SIZE;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

/// The compressed pool may take at most this share of the mapped budget:
/// the rest stays for pages in use. (zswap's default cap is a fifth of
/// RAM. At 3/4, redis with text values at a quarter local ran the pool to
/// its cap and its hot pages cycled through it: 2.4 faults an operation.)
const POOL_SHARE_MAX: (usize, usize) = (1, 2);
/// The most pages the pool may take of `mapped_pages`.
pub(crate) fn pool_pages_max(mapped_pages: usize) -> usize {
    mapped_pages * POOL_SHARE_MAX.0 / POOL_SHARE_MAX.1
}

const CHUNK_BYTES: usize = 256;
const CHUNKS_PER_PAGE: usize = PAGE_SIZE / CHUNK_BYTES;
/// A page that compresses to more than this goes to the store alone: it
/// would save under a quarter of its memory.
pub(crate) const KEEP_BYTES_MAX: usize = 3 * 1024;
const NONE: u32 = u32::MAX;
/// Compressing a page, before any is measured (about what lz4 takes here).
const PACK_NS_GUESS: u64 = 6_000;
/// Pool hits and far misses between two looks at the limit.
const EPOCH_EVENTS: u64 = 512;
/// The limit moves by this share of its maximum per epoch.
const STEP_SHARE: usize = 32;

/// Of the last 32 pages tried, this many failed to compress: then try only
/// one page in `SAMPLE_EVERY`, to notice when data that compresses comes.
const REFUSED_OF_32_MAX: u32 = 28;
const SAMPLE_EVERY: u32 = 8;

/// Compressed pages on their way from the write-back thread to the pool.
#[derive(Default)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    /// (page, offset in `bytes`, length).
    pages: Vec<(u32, usize, usize)>,
    /// Pages that did not compress, or were not tried.
    refused: u64,
    /// Nanoseconds spent compressing (the pages kept and refused alike).
    pack_ns: u64,
    /// Pages not offered to the codec because the pool was at its smallest.
    skipped: u64,
}

/// Compresses pages for the pool, on the write-back thread.
pub(crate) struct Packer {
    engine: Engine,
    scratch: Vec<u8>,
    /// One bit per page tried lately, set if it did not compress.
    refusals: u32,
    untried: u32,
    /// Compress one page in this many (set by the pool: 1, or
    /// `SAMPLE_EVERY` while it is at its smallest and its copies are
    /// seldom used), and how many were offered.
    one_in: Arc<AtomicU32>,
    offered: u32,
}

impl Packer {
    fn new(engine: Engine, one_in: Arc<AtomicU32>) -> Packer {
        let scratch = vec![0; packed_bytes_max()];
        Packer { engine, scratch, refusals: 0, untried: 0, one_in, offered: 0 }
    }

    /// Append `bytes` (a page) to `out` compressed, if it compresses to at
    /// most `KEEP_BYTES_MAX`.
    pub(crate) fn pack(&mut self, page: u32, bytes: &[u8], out: &mut Packed) {
        self.offered = self.offered.wrapping_add(1);
        if !self.offered.is_multiple_of(self.one_in.load(Relaxed).max(1)) {
            out.skipped += 1;
            return;
        }
        if self.refusals.count_ones() >= REFUSED_OF_32_MAX {
            self.untried += 1;
            if !self.untried.is_multiple_of(SAMPLE_EVERY) {
                out.refused += 1;
                return;
            }
        }
        let packing = std::time::Instant::now();
        let len = self.engine.compress(bytes, &mut self.scratch);
        out.pack_ns += packing.elapsed().as_nanos() as u64;
        let kept = len.filter(|&len| len <= KEEP_BYTES_MAX);
        self.refusals = (self.refusals << 1) | u32::from(kept.is_none());
        match kept {
            Some(len) => {
                out.pages.push((page, out.bytes.len(), len));
                out.bytes.extend_from_slice(&self.scratch[..len]);
            }
            None => out.refused += 1,
        }
    }
}

struct Entry {
    first_chunk: u32,
    len_bytes: u16,
    /// Insertion number, for FIFO order and the "newest entries" test.
    seq: u64,
}

/// What the pool did, for the region's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages put in the pool.
    pub pages_stored: u64,
    /// Victims that compressed to more than `KEEP_BYTES_MAX`, or were not
    /// tried because lately almost none compressed: store only.
    pub pages_incompressible: u64,
    /// Victims not compressed because the pool was at its smallest (it
    /// then takes one in `SAMPLE_EVERY`, to keep learning).
    pub pages_skipped: u64,
    /// Entries dropped to make room or when the limit fell.
    pub pages_dropped: u64,
    /// Faults on pages dropped from the pool lately (a bigger pool would
    /// have served them).
    pub ghost_hits: u64,
    /// Pages in the pool now, and their compressed bytes.
    pub pages_held: u64,
    pub bytes_held: u64,
    /// Memory the pool is charged for now, and the most it may take now.
    pub charged_pages: u64,
    pub limit_pages: u64,
}

pub(crate) struct ZPool {
    arena: PageBuf,
    /// Per chunk: the next chunk of its page, or `NONE`.
    next: Vec<u32>,
    /// Per chunk: the page whose bytes it holds, or `NONE` if free.
    owner: Vec<u32>,
    /// A set bit is a free chunk.
    free_bits: Vec<u64>,
    /// No free chunk lies in a word below this one.
    low_free_word: usize,
    chunks_used: usize,
    limit_pages: usize,
    /// The arena's size: the most the limit can ever be.
    limit_pages_max: usize,
    /// The most the limit may be now (the budget may have shrunk).
    limit_cap_pages: usize,
    top_pages: usize,
    entries: HashMap<u32, Entry>,
    order: VecDeque<(u32, u64)>,
    seq: u64,
    /// Pages dropped lately, with their drop number; bounded by
    /// `ghost_limit`.
    ghosts: HashMap<u32, u64>,
    ghost_order: VecDeque<(u32, u64)>,
    dropped_seq: u64,
    /// Its codec (the packers' too), and its working state for taking
    /// pages out.
    codec: Codec,
    engine: Engine,
    /// Scratch: one compressed page on its way in, and one gathered from
    /// its chunks on its way out.
    packed: Vec<u8>,
    gathered: Vec<u8>,
    epoch: Epoch,
    stats: PoolStats,
    /// Shared with the write-back thread's `Packer`.
    pack_one_in: Arc<AtomicU32>,
    clean_batches: u32,
    /// Compression time and pages kept, for its mean cost per kept page.
    pack_ns: u64,
    packed_pages: u64,
    /// Take every victim that compresses, not only the reused ones.
    admits_all: bool,
}

/// Signals gathered since the limit last moved.
#[derive(Default)]
struct Epoch {
    events: u64,
    /// Far misses on pages dropped within the last step's worth of entries.
    near_ghost_hits: u64,
    /// Pool hits on entries among the last step's worth inserted.
    newest_hits: u64,
}

/// Measured costs of a fault, for `adapt`.
pub(crate) struct Costs {
    /// A fault served by a store read, and one served from the pool.
    pub far_ns: u64,
    pub pool_ns: u64,
}

impl ZPool {
    /// A pool of at most `limit_pages_max` of memory (reserved address
    /// space, faulted in as used), starting at half of that, its pages
    /// compressed by `codec`.
    pub(crate) fn new(limit_pages_max: usize, codec: Codec) -> std::io::Result<ZPool> {
        let chunks = limit_pages_max.max(1) * CHUNKS_PER_PAGE;
        let words = chunks.div_ceil(64);
        let mut free_bits = vec![u64::MAX; words];
        if !chunks.is_multiple_of(64) {
            free_bits[words - 1] = (1u64 << (chunks % 64)) - 1;
        }
        Ok(ZPool {
            arena: PageBuf::new(limit_pages_max.max(1))?,
            next: vec![NONE; chunks],
            owner: vec![NONE; chunks],
            free_bits,
            low_free_word: 0,
            chunks_used: 0,
            limit_pages: limit_pages_max / 2,
            limit_pages_max,
            limit_cap_pages: limit_pages_max,
            top_pages: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
            seq: 0,
            ghosts: HashMap::new(),
            ghost_order: VecDeque::new(),
            dropped_seq: 0,
            codec,
            engine: Engine::new(codec)?,
            packed: vec![0; packed_bytes_max()],
            gathered: vec![0; KEEP_BYTES_MAX],
            epoch: Epoch::default(),
            stats: PoolStats::default(),
            pack_ns: 0,
            packed_pages: 0,
            pack_one_in: Arc::new(AtomicU32::new(1)),
            clean_batches: 0,
            admits_all: false,
        })
    }

    /// Take every victim that compresses (zswap's way), not only the ones
    /// that came back after an eviction before (`admits`).
    pub(crate) fn admitting_all(self) -> ZPool {
        ZPool { admits_all: true, ..self }
    }

    /// Whether a victim is worth compressing: one taken from the eviction
    /// policy's main queue, a page that came back after an eviction, is
    /// likely to come back again; one from probation mostly is not. A redis
    /// run (zipfian keys, a quarter local) that compressed every victim
    /// compressed 397 K pages, at 6 µs each, to serve 61 K faults.
    pub(crate) fn admits(&self, victim_from_main: bool) -> bool {
        self.admits_all || victim_from_main
    }

    /// The packer for the write-back thread, told by this pool how many
    /// pages to compress.
    pub(crate) fn packer(&self) -> std::io::Result<Packer> {
        Ok(Packer::new(Engine::new(self.codec)?, Arc::clone(&self.pack_one_in)))
    }

    /// Whether a batch of clean victims with nothing to write should go to
    /// the write-back thread to be compressed. At its smallest the pool
    /// takes one such batch in `SAMPLE_EVERY`: each one holds a staging
    /// half until the thread gets to it, and with the pool there a redis run
    /// had evictions wait for a half 231 times (595 ms), against 11 (65 ms)
    /// with the pool off.
    pub(crate) fn wants_clean_batch(&mut self) -> bool {
        if self.pack_one_in.load(Relaxed) == 1 {
            return true;
        }
        self.clean_batches = self.clean_batches.wrapping_add(1);
        self.clean_batches.is_multiple_of(SAMPLE_EVERY)
    }

    /// Memory the pool holds now, in pages: count it against the budget.
    pub(crate) fn charged_pages(&self) -> usize {
        self.top_pages
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            pages_held: self.entries.len() as u64,
            charged_pages: self.top_pages as u64,
            limit_pages: self.limit_pages as u64,
            ..self.stats
        }
    }

    /// Keep a copy of `page`, whose current bytes the store holds. False if
    /// it does not compress well enough or the pool has no room at all.
    #[cfg(test)]
    pub(crate) fn insert(&mut self, page: u32, bytes: &[u8]) -> bool {
        let mut packed = Packed::default();
        self.packer().expect("a packer for a test").pack(page, bytes, &mut packed);
        self.insert_packed(&packed, |_| true) == 1
    }

    /// Keep the pages of `packed` (compressed by a `Packer`) for which
    /// `current` says the store holds these very bytes. How many were kept.
    pub(crate) fn insert_packed(
        &mut self,
        packed: &Packed,
        current: impl Fn(u32) -> bool,
    ) -> usize {
        self.stats.pages_incompressible += packed.refused;
        self.stats.pages_skipped += packed.skipped;
        self.pack_ns += packed.pack_ns;
        self.packed_pages += packed.pages.len() as u64;
        let mut kept = 0;
        for &(page, offset, len) in &packed.pages {
            if !current(page) {
                continue;
            }
            self.remove(page);
            self.packed[..len].copy_from_slice(&packed.bytes[offset..offset + len]);
            kept += usize::from(self.keep(page, len));
        }
        kept
    }

    /// Store `self.packed[..len_bytes]` as `page`'s entry, dropping the
    /// oldest entries for room.
    fn keep(&mut self, page: u32, len_bytes: usize) -> bool {
        let need = len_bytes.div_ceil(CHUNK_BYTES);
        // Each turn drops an entry, so the entries bound the loop.
        while (self.limit_pages * CHUNKS_PER_PAGE).saturating_sub(self.chunks_used) < need {
            if !self.drop_oldest() {
                return false;
            }
        }
        let first_chunk = self.store_chunks(page, len_bytes);
        self.ghosts.remove(&page);
        self.seq += 1;
        self.entries
            .insert(page, Entry { first_chunk, len_bytes: len_bytes as u16, seq: self.seq });
        self.order.push_back((page, self.seq));
        self.stats.pages_stored += 1;
        self.stats.bytes_held += len_bytes as u64;
        true
    }

    /// Copy `self.packed[..len_bytes]` into free chunks for `page`; the
    /// caller made sure enough are free below the limit.
    fn store_chunks(&mut self, page: u32, len_bytes: usize) -> u32 {
        let mut first = NONE;
        let mut prev = NONE;
        for piece in 0..len_bytes.div_ceil(CHUNK_BYTES) {
            let chunk = self.alloc_chunk().expect("free chunks were counted");
            let from = piece * CHUNK_BYTES;
            let to = (from + CHUNK_BYTES).min(len_bytes);
            let at = chunk as usize * CHUNK_BYTES;
            let arena = self.arena.bytes_mut(self.limit_pages_max * PAGE_SIZE);
            arena[at..at + to - from].copy_from_slice(&self.packed[from..to]);
            self.owner[chunk as usize] = page;
            if prev == NONE {
                first = chunk;
            } else {
                self.next[prev as usize] = chunk;
            }
            prev = chunk;
            self.top_pages = self.top_pages.max(chunk as usize / CHUNKS_PER_PAGE + 1);
        }
        first
    }

    /// The lowest free chunk below the limit.
    fn alloc_chunk(&mut self) -> Option<u32> {
        let limit_chunks = self.limit_pages * CHUNKS_PER_PAGE;
        let words = limit_chunks.div_ceil(64);
        for word in self.low_free_word..words {
            let bits = self.free_bits[word];
            if bits == 0 {
                continue;
            }
            self.low_free_word = word;
            let chunk = word * 64 + bits.trailing_zeros() as usize;
            if chunk >= limit_chunks {
                return None;
            }
            self.free_bits[word] &= !(1u64 << (chunk % 64));
            self.next[chunk] = NONE;
            self.chunks_used += 1;
            return Some(chunk as u32);
        }
        self.low_free_word = words;
        None
    }

    fn free_chain(&mut self, first_chunk: u32) {
        let mut chunk = first_chunk;
        // A chain holds at most KEEP_BYTES_MAX / CHUNK_BYTES chunks.
        for _ in 0..KEEP_BYTES_MAX / CHUNK_BYTES {
            if chunk == NONE {
                return;
            }
            let at = chunk as usize;
            let following = self.next[at];
            self.owner[at] = NONE;
            self.next[at] = NONE;
            self.free_bits[at / 64] |= 1u64 << (at % 64);
            self.low_free_word = self.low_free_word.min(at / 64);
            self.chunks_used -= 1;
            chunk = following;
        }
        debug_assert_eq!(chunk, NONE, "a chain longer than a kept page");
    }

    /// Whether the pool holds a copy of `page`.
    pub(crate) fn holds(&self, page: u32) -> bool {
        self.entries.contains_key(&page)
    }

    /// A fault on `page`: if the pool holds it, decompress it into `out`
    /// (one page) and drop the entry. False if it is not here (or, which
    /// would be a bug, its bytes do not decompress to a page: logged, and
    /// the caller reads the store).
    pub(crate) fn take(&mut self, page: u32, out: &mut [u8]) -> bool {
        let Some(entry) = self.entries.remove(&page) else {
            return false;
        };
        self.epoch.events += 1;
        if self.seq - entry.seq < self.step_pages() as u64 {
            self.epoch.newest_hits += 1;
        }
        let len_bytes = usize::from(entry.len_bytes);
        self.gather(entry.first_chunk, len_bytes);
        self.free_chain(entry.first_chunk);
        self.stats.bytes_held -= len_bytes as u64;
        match self.engine.decompress(&self.gathered[..len_bytes], out) {
            Ok(n) if n == PAGE_SIZE => true,
            other => {
                tracing::error!("compressed pool: page {page} did not decompress ({other:?}); reading the store");
                false
            }
        }
    }

    fn gather(&mut self, first_chunk: u32, len_bytes: usize) {
        let arena = self.arena.bytes(self.limit_pages_max * PAGE_SIZE);
        let mut chunk = first_chunk;
        for piece in 0..len_bytes.div_ceil(CHUNK_BYTES) {
            let from = piece * CHUNK_BYTES;
            let to = (from + CHUNK_BYTES).min(len_bytes);
            let at = chunk as usize * CHUNK_BYTES;
            self.gathered[from..to].copy_from_slice(&arena[at..at + to - from]);
            chunk = self.next[chunk as usize];
        }
    }

    /// `page` is mapped or discarded other than by a fault from the pool:
    /// its entry, if any, is no longer a copy of anything.
    pub(crate) fn remove(&mut self, page: u32) {
        if let Some(entry) = self.entries.remove(&page) {
            self.free_chain(entry.first_chunk);
            self.stats.bytes_held -= u64::from(entry.len_bytes);
        }
    }

    /// `remove` for every page in `first..first + count`.
    pub(crate) fn remove_range(&mut self, first: u32, count: u32) {
        let range = first..first.saturating_add(count);
        if count as usize <= self.entries.len() {
            range.for_each(|page| self.remove(page));
            return;
        }
        let doomed: Vec<u32> = self.entries.keys().copied().filter(|p| range.contains(p)).collect();
        doomed.into_iter().for_each(|page| self.remove(page));
    }

    /// Drop every entry and give all the memory back.
    pub(crate) fn clear(&mut self) {
        let pages: Vec<u32> = self.entries.keys().copied().collect();
        pages.into_iter().for_each(|page| self.remove(page));
        self.order.clear();
        self.give_back(0);
    }

    /// A fault that read the store. If the page left the pool lately, a
    /// bigger pool would have served it.
    pub(crate) fn far_miss(&mut self, page: u32) {
        self.epoch.events += 1;
        if let Some(dropped) = self.ghosts.remove(&page) {
            self.stats.ghost_hits += 1;
            let window = (self.step_pages() * self.entries_per_page()) as u64;
            if self.dropped_seq - dropped < window {
                self.epoch.near_ghost_hits += 1;
            }
        }
    }

    /// Drop the oldest entry; false if there is none.
    fn drop_oldest(&mut self) -> bool {
        // Stale order entries (taken or removed pages) are skipped; each
        // turn pops one, so the queue's length bounds the loop.
        while let Some((page, seq)) = self.order.pop_front() {
            if self.entries.get(&page).is_some_and(|e| e.seq == seq) {
                self.remove(page);
                self.remember_dropped(page);
                return true;
            }
        }
        false
    }

    fn remember_dropped(&mut self, page: u32) {
        self.stats.pages_dropped += 1;
        self.dropped_seq += 1;
        // Only ghosts within a step's worth of entries count (`far_miss`):
        // at most a 32nd of the arena, 16 entries a page.
        let ghost_limit = (self.limit_pages_max / 2).max(64);
        if self.ghost_order.len() >= ghost_limit {
            if let Some((old, seq)) = self.ghost_order.pop_front() {
                if self.ghosts.get(&old) == Some(&seq) {
                    self.ghosts.remove(&old);
                }
            }
        }
        self.ghosts.insert(page, self.dropped_seq);
        self.ghost_order.push_back((page, self.dropped_seq));
    }

    fn step_pages(&self) -> usize {
        (self.limit_pages_max / STEP_SHARE).max(1)
    }

    /// Entries a page of pool memory holds at the present mean size.
    fn entries_per_page(&self) -> usize {
        let held = self.entries.len().max(1) as u64;
        let mean_bytes = (self.stats.bytes_held / held).max(CHUNK_BYTES as u64 / 2);
        (PAGE_SIZE as u64 / (mean_bytes + CHUNK_BYTES as u64 / 2)).max(1) as usize
    }

    /// Once an epoch's events are in, move the limit a step towards the
    /// use of memory that would have saved more fault time.
    pub(crate) fn adapt(&mut self, costs: &Costs) {
        if self.epoch.events < EPOCH_EVENTS {
            return;
        }
        // A page served from the pool was compressed to get there: on a
        // machine whose cores are all busy that is as much a cost as the
        // fault's own time.
        let pack_ns = self.pack_ns.checked_div(self.packed_pages).unwrap_or(PACK_NS_GUESS);
        let pool_ns = costs.pool_ns + pack_ns;
        let saved_by_pool = self.epoch.near_ghost_hits * costs.far_ns.saturating_sub(pool_ns);
        let saved_by_resident = self.epoch.newest_hits * pool_ns;
        self.epoch = Epoch::default();
        let step = self.step_pages();
        // At its smallest the pool's copies are seldom worth their
        // compression: take one victim in SAMPLE_EVERY, enough to see when
        // that changes. 190 K pages were compressed for 10 K pool faults
        // in a redis run that held the pool there, and evictions waited
        // for the compressing thread 954 times (292 ms).
        let smallest = self.limit_pages <= 2 * step;
        self.pack_one_in.store(if smallest { SAMPLE_EVERY } else { 1 }, Relaxed);
        if saved_by_pool > saved_by_resident {
            self.limit_pages = (self.limit_pages + step).min(self.limit_cap_pages);
        } else if saved_by_resident > saved_by_pool {
            // Never to nothing: with no drops there are no ghosts, and the
            // limit could never learn to grow again.
            self.set_limit(self.limit_pages.saturating_sub(step).max(step));
        }
    }

    /// The budget changed: the limit may go up to `cap_pages` from now on
    /// (never past the arena), and comes down to it at once.
    pub(crate) fn cap(&mut self, cap_pages: usize) {
        self.limit_cap_pages = cap_pages.min(self.limit_pages_max);
        if self.limit_pages > self.limit_cap_pages {
            self.set_limit(self.limit_cap_pages);
        }
    }

    /// Lower (or raise) the limit; entries with chunks at or above a lower
    /// limit are dropped and their memory given back.
    pub(crate) fn set_limit(&mut self, limit_pages: usize) {
        let limit_pages = limit_pages.min(self.limit_cap_pages);
        if limit_pages < self.top_pages {
            let (from, to) = (limit_pages * CHUNKS_PER_PAGE, self.top_pages * CHUNKS_PER_PAGE);
            for chunk in from..to {
                let page = self.owner[chunk];
                if page != NONE {
                    self.remove(page);
                    self.remember_dropped(page);
                }
            }
            self.give_back(limit_pages);
        }
        self.limit_pages = limit_pages;
    }

    /// Release the arena's pages from `from_page` up to the top.
    fn give_back(&mut self, from_page: usize) {
        if from_page < self.top_pages {
            let len_bytes = (self.top_pages - from_page) * PAGE_SIZE;
            if let Err(e) = self.arena.discard(from_page * PAGE_SIZE, len_bytes) {
                tracing::warn!("compressed pool: giving back memory failed: {e}");
            }
            self.top_pages = from_page;
        }
    }
}

#[cfg(test)]
mod tests;
