//! `pack`: pages go to the store below compressed, several to a page of it
//! (a "bin"), so a write-back moves fewer bytes over the wire or to the
//! disk, and a donor or a file holds fewer pages. A map says where each
//! page lives: its bin, and its bytes' offset and length in it.
//!
//! Why: the issue's "the pool's cold tail goes to the far store still
//! compressed" and "compressed pages packed into the file". Text-like data
//! comes to a third or a half of its size with lz4 (`codec.rs`), and a
//! write of a batch of such pages takes that many fewer pages below.
//!
//! How:
//! - A write compresses its pages and lays them end to end in fresh bins,
//!   in order; an entry never spans two bins. A page that compresses to
//!   more than `PACKED_BYTES_MAX` takes a bin of its own, as it is (a raw
//!   bin, read straight into the caller's buffer). A page of zeroes takes
//!   nothing: it reads back as zeroes, as a discarded page does. When almost
//!   every page lately failed to compress, only one in `TRY_ONE_IN` is
//!   tried, so random data costs about a memcpy, not a compression.
//! - A bin is free again when every entry in it has been rewritten or
//!   discarded. Every live bin holds at least one live page, so at most
//!   `pages` bins are live whatever the data, and a store below with
//!   `bins_for(pages)` bins (an eighth more, at least `CHUNK_PAGES` more)
//!   always has room for a chunk of a write once the writes in flight
//!   settle: a write goes down `CHUNK_PAGES` at a time, each chunk taking
//!   all its bins or waiting for them. So no cleaner is needed for
//!   correctness; one (`pack_clean.rs`) repacks bins that fell to half
//!   full with each chunk, so rewrites do not leave the pages below holding
//!   a page or two each.
//! - Reuse is safe against reads in flight exactly as in `append`: a bin
//!   that empties waits in `quarantine` until no read holds the `gate`.
//!
//! Cost: a compression per page written (lz4 ~6 µs on text here, ~1 µs to
//! refuse random bytes) and a decompression per page read (~2 µs); 8 bytes
//! of map a page, 5 a bin, and 4 a bin freed and not yet reused; 6 bytes
//! in the bin before each entry (its page and length, for the cleaner).
//! Reads still move a whole bin: a page read costs the same bytes on the
//! wire, fewer only for pages read together that were written together.

use crate::codec::{packed_bytes_max, Codec, Engine};
use crate::{check_range, check_run, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use crate::{WriteOp, PAGE_SIZE};
use parking_lot::{Condvar, Mutex, RwLock};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub const ADDS: &str = "pages compressed (lz4), several to a page of the store below";
pub const ADDS_ZSTD: &str = "pages compressed (zstd), several to a page of the store below";

/// A write goes down this many pages at a time (at most this many bins
/// in flight per writer), and the store below has at least this many
/// bins more than this one has pages.
pub const CHUNK_PAGES: usize = 256;
/// The store below has this share more bins than this store has pages.
const SLACK_SHARE: u64 = 8;

/// Bins the store below needs for a store of `pages` pages.
pub fn bins_for(pages: u64) -> u64 {
    slack_bins(pages, CHUNK_PAGES) + pages
}

fn slack_bins(pages: u64, chunk_pages: usize) -> u64 {
    (pages / SLACK_SHARE).max(chunk_pages as u64)
}

/// The most pages a store below of `bins` bins can offer (the inverse of
/// [`bins_for`]).
pub fn pages_for(bins: u64) -> u64 {
    let mut pages =
        (bins.saturating_sub(CHUNK_PAGES as u64)).min(bins * SLACK_SHARE / (SLACK_SHARE + 1) + 1);
    while pages > 0 && bins_for(pages) > bins {
        pages -= 1;
    }
    pages
}
/// A page that compresses to more than this goes below as it is: packing
/// it would save under a quarter of a bin and still cost a decompression.
pub const PACKED_BYTES_MAX: usize = 3 * 1024;
/// While almost every page fails to compress, one page in this many is tried.
const TRY_ONE_IN: u32 = 8;
/// Before each packed entry in its bin: its page (u32) and length (u16),
/// so the cleaner can tell which pages a bin holds.
const ENTRY_PREFIX: usize = 6;
/// A packed bin whose live entries take this many bytes or fewer is
/// repacked by the cleaner (`pack_clean.rs`): half, so that a bin of two
/// lz4 pages of text (about 2 KiB each) that lost one is repacked.
const SPARSE_BYTES: usize = PAGE_SIZE / 2;
/// Sparse bins repacked with each chunk of a write, at most: their live
/// entries (at most 8 KiB) fit in three bins, so a chunk of
/// `chunk_pages - CLEAN_BINS_MAX` pages still takes at most `chunk_pages`.
const CLEAN_BINS_MAX: usize = 4;

/// A page's place: `bin << 32 | offset << 16 | len`; `len == PAGE_SIZE`
/// is a raw bin. `NONE` reads as zeroes.
const NONE: u64 = u64::MAX;

fn loc(bin: u32, offset: usize, len: usize) -> u64 {
    debug_assert!(offset < PAGE_SIZE && len <= PAGE_SIZE && offset + len <= PAGE_SIZE);
    u64::from(bin) << 32 | (offset as u64) << 16 | len as u64
}

fn bin_of(loc: u64) -> u32 {
    (loc >> 32) as u32
}

fn span_of(loc: u64) -> (usize, usize) {
    (((loc >> 16) & 0xffff) as usize, (loc & 0xffff) as usize)
}

pub struct Pack<S> {
    inner: S,
    pages: u64,
    codec: Codec,
    map: Mutex<Map>,
    /// Held shared by every read from its lookup to the end of its I/O;
    /// taken exclusively only to empty the quarantine.
    gate: RwLock<()>,
    /// Pages a write puts down at once (`CHUNK_PAGES`; smaller in tests).
    chunk_pages: usize,
    /// Signalled when a write's bins settle or go back.
    settled: Condvar,
    /// zstd's contexts, one per thread in a write or read at once.
    engines: Mutex<Vec<Engine>>,
    /// The last 32 pages tried, one bit each: 1 if it did not compress.
    refused_recent: AtomicU32,
    tried: AtomicU32,
    counts: Counts,
}

/// What the layer did, for its report line.
#[derive(Default)]
struct Counts {
    pages_written: AtomicU64,
    bins_written: AtomicU64,
    pages_raw: AtomicU64,
    pages_zero: AtomicU64,
    pages_moved: AtomicU64,
}

struct Map {
    loc_of: Vec<u64>,
    /// Live entries in each bin; a bin with none is free or in quarantine.
    live: Vec<u16>,
    /// Bytes the live entries of a packed bin take, prefixes included.
    live_bytes: Vec<u16>,
    /// Packed bins that fell to `SPARSE_BYTES` or fewer, for the cleaner
    /// (stale ones are skipped when taken); `in_sparse` keeps each once.
    sparse: Vec<u32>,
    in_sparse: Vec<bool>,
    /// Bins freed since they were first used, the most recently freed
    /// taken first; then bins never used, lowest first (`fresh` on). So a
    /// donor's or a file's touched pages are the most ever in use at once.
    free: Vec<u32>,
    fresh: u32,
    quarantine: Vec<u32>,
    /// Bins taken by writes not yet settled.
    in_flight: usize,
}

impl Map {
    /// `page` now lives at `at` (whose bin counts it already: `hold`); the
    /// bin it leaves empties into quarantine, or may become sparse.
    fn place(&mut self, page: u64, at: u64) {
        let old = std::mem::replace(&mut self.loc_of[page as usize], at);
        if old == NONE {
            return;
        }
        let bin = bin_of(old) as usize;
        let len = span_of(old).1;
        assert!(self.live[bin] > 0, "page {page} left bin {bin}, which had no live entry");
        self.live[bin] -= 1;
        if len < PAGE_SIZE {
            self.live_bytes[bin] -= (ENTRY_PREFIX + len) as u16;
        }
        if self.live[bin] == 0 {
            self.live_bytes[bin] = 0;
            self.quarantine.push(bin as u32);
        } else if usize::from(self.live_bytes[bin]) <= SPARSE_BYTES && !self.in_sparse[bin] {
            self.in_sparse[bin] = true;
            self.sparse.push(bin as u32);
        }
    }

    /// `bin` holds one more live entry of `len` bytes (`PAGE_SIZE`: raw).
    fn hold(&mut self, bin: u32, len: usize) {
        self.live[bin as usize] += 1;
        if len < PAGE_SIZE {
            self.live_bytes[bin as usize] += (ENTRY_PREFIX + len) as u16;
        }
    }

    fn release_quarantine(&mut self) {
        self.free.append(&mut self.quarantine);
    }

    fn free_bins(&self) -> usize {
        self.free.len() + (self.live.len() - self.fresh as usize)
    }

    /// `n` free bins; the caller checked `free_bins() >= n`.
    fn take(&mut self, n: usize) -> Vec<u32> {
        let reused = self.free.len().min(n);
        let mut bins = self.free.split_off(self.free.len() - reused);
        let fresh = (n - reused) as u32;
        bins.extend(self.fresh..self.fresh + fresh);
        self.fresh += fresh;
        bins
    }

    /// Bins holding data or being written now.
    fn bins_live(&self) -> usize {
        self.fresh as usize - self.free.len() - self.quarantine.len()
    }
}

/// One page of a write, as it will go below.
enum Entry<'a> {
    Zero,
    Raw(&'a [u8]),
    /// Bytes `start..start + len` of the write's packed buffer.
    Packed {
        start: usize,
        len: usize,
    },
}

impl<S: PageStore> Pack<S> {
    /// Wraps `inner`, which must have at least `bins_for(pages)` pages.
    pub fn new(inner: S, pages: u64, codec: Codec) -> StoreResult<Self> {
        Self::with_chunk(inner, pages, codec, CHUNK_PAGES)
    }

    /// The same, writing `chunk_pages` at a time (tests use a small one,
    /// so that bins are reused often).
    fn with_chunk(inner: S, pages: u64, codec: Codec, chunk_pages: usize) -> StoreResult<Self> {
        assert!(
            chunk_pages >= 2 * CLEAN_BINS_MAX,
            "a chunk of {chunk_pages} leaves no room to clean"
        );
        let bins = pages + slack_bins(pages, chunk_pages);
        let below = inner.info().pages;
        if bins > below {
            return Err(StoreError::NoSpace(format!(
                "pack: {pages} pages need {bins} pages below, which has {below}"
            )));
        }
        if bins >= u64::from(u32::MAX) {
            return Err(StoreError::NoSpace(format!("pack: {pages} pages is too many")));
        }
        let map = Map {
            loc_of: vec![NONE; pages as usize],
            live: vec![0; bins as usize],
            live_bytes: vec![0; bins as usize],
            sparse: Vec::new(),
            in_sparse: vec![false; bins as usize],
            free: Vec::new(),
            fresh: 0,
            quarantine: Vec::new(),
            in_flight: 0,
        };
        Ok(Pack {
            inner,
            pages,
            codec,
            map: Mutex::new(map),
            gate: RwLock::new(()),
            chunk_pages,
            settled: Condvar::new(),
            engines: Mutex::new(Vec::new()),
            refused_recent: AtomicU32::new(0),
            tried: AtomicU32::new(0),
            counts: Counts::default(),
        })
    }

    fn engine(&self) -> StoreResult<Engine> {
        match self.engines.lock().pop() {
            Some(engine) => Ok(engine),
            None => Ok(Engine::new(self.codec)?),
        }
    }

    /// Whether to try compressing the next page: always, unless nearly
    /// every one of the last 32 tried failed.
    fn worth_trying(&self) -> bool {
        if self.refused_recent.load(Relaxed).count_ones() < 28 {
            return true;
        }
        self.tried.fetch_add(1, Relaxed).is_multiple_of(TRY_ONE_IN)
    }

    fn note_tried(&self, refused: bool) {
        let _ =
            self.refused_recent.fetch_update(Relaxed, Relaxed, |r| Some(r << 1 | refused as u32));
    }

    /// Each page of `ops` (one op a page) as it will go below; packed
    /// entries go into `packed`, each after its prefix.
    fn classify<'a>(
        &self,
        ops: &'a [WriteOp<'_>],
        packed: &mut Vec<u8>,
    ) -> StoreResult<Vec<Entry<'a>>> {
        let mut engine = self.engine()?;
        let mut scratch = vec![0u8; packed_bytes_max()];
        let mut entries = Vec::new();
        for (op, page) in ops.iter().map(|op| (op, op.data)) {
            if page.iter().all(|&b| b == 0) {
                entries.push(Entry::Zero);
                continue;
            }
            if !self.worth_trying() {
                entries.push(Entry::Raw(page));
                continue;
            }
            match engine.compress(page, &mut scratch) {
                Some(len) if len <= PACKED_BYTES_MAX => {
                    self.note_tried(false);
                    entries.push(Entry::Packed { start: packed.len(), len });
                    push_entry(packed, op.page, &scratch[..len]);
                }
                _ => {
                    self.note_tried(true);
                    entries.push(Entry::Raw(page));
                }
            }
        }
        self.engines.lock().push(engine);
        Ok(entries)
    }

    /// `n` free bins (at most a chunk's), all or none: waiting for the
    /// quarantine to empty or for writes in flight to settle, never
    /// holding some while waiting for more (two writers would deadlock).
    fn allocate(&self, n: usize) -> StoreResult<Vec<u32>> {
        assert!(n <= self.chunk_pages, "a chunk of {n} bins is over {}", self.chunk_pages);
        let mut map = self.map.lock();
        loop {
            if map.free_bins() >= n {
                map.in_flight += n;
                return Ok(map.take(n));
            }
            if !map.quarantine.is_empty() {
                drop(map);
                let _no_reads = self.gate.write();
                map = self.map.lock();
                map.release_quarantine();
                continue;
            }
            if map.in_flight == 0 {
                // The slack holds a chunk once every write has settled.
                return Err(StoreError::NoSpace(format!(
                    "pack: {n} bins wanted, {} free and none in flight (a bug)",
                    map.free_bins()
                )));
            }
            self.settled.wait(&mut map);
        }
    }

    /// Bins a failed write took go back unused.
    fn give_back(&self, bins: &[u32]) {
        let mut map = self.map.lock();
        map.free.extend_from_slice(bins);
        map.in_flight -= bins.len();
        self.settled.notify_all();
    }

    /// Bins left by writes and discards become free if no read is in flight.
    fn release(&self) {
        if let Some(_no_reads) = self.gate.try_write() {
            self.map.lock().release_quarantine();
        }
    }

    /// What the layer has done, in one line (its report).
    pub fn summary(&self) -> String {
        let c = &self.counts;
        let pages = c.pages_written.load(Relaxed);
        let bins = c.bins_written.load(Relaxed);
        let ratio = if bins == 0 { 1.0 } else { pages as f64 / bins as f64 };
        let map = self.map.lock();
        format!(
            "pack ({:?}): {pages} pages written as {bins} pages below ({ratio:.2}x), {} of them as they were, {} zero, {} moved by the cleaner; {} pages below hold data now, {} ever used",
            self.codec,
            c.pages_raw.load(Relaxed),
            c.pages_zero.load(Relaxed),
            c.pages_moved.load(Relaxed),
            map.bins_live(),
            map.fresh
        )
    }
}

/// A page that failed its check: `actual` is the bytes it decoded to.
fn corrupt(page: u64, actual: u32) -> StoreError {
    StoreError::Corrupt { page, expected: PAGE_SIZE as u32, actual }
}

/// Where each entry goes: (index of its bin in the write, offset of its
/// bytes in it).
type Places = Vec<(usize, usize)>;
/// Each bin of a write as (start, end) in its packed bytes.
type Spans = Vec<(usize, usize)>;

/// Append an entry (its prefix, then its bytes) to `packed`.
fn push_entry(packed: &mut Vec<u8>, page: u64, bytes: &[u8]) {
    packed.extend_from_slice(&(page as u32).to_le_bytes());
    packed.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    packed.extend_from_slice(bytes);
}

/// Packed entries, as (start of its prefix in `packed`, bytes' length),
/// consecutive in `packed`, laid end to end in bins, in order.
fn lay_out(items: &[(usize, usize)]) -> (Places, Spans) {
    let mut place = Vec::with_capacity(items.len());
    let mut bins: Vec<(usize, usize)> = Vec::new();
    for &(start, len) in items {
        let size = ENTRY_PREFIX + len;
        let last = bins.len().wrapping_sub(1);
        match bins.last_mut() {
            Some((bin_start, end)) if *end + size - *bin_start <= PAGE_SIZE => {
                place.push((last, start - *bin_start + ENTRY_PREFIX));
                *end += size;
            }
            _ => {
                place.push((bins.len(), ENTRY_PREFIX));
                bins.push((start, start + size));
            }
        }
    }
    (place, bins)
}

impl<S: PageStore> PageStore for Pack<S> {
    fn info(&self) -> StoreInfo {
        let mut info = self.inner.info();
        info.pages = self.pages;
        // A discard frees a bin for reuse, not the store below it.
        info.caps.discard_frees = false;
        info.name = format!("pack({})", info.name);
        info
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        let _reading = self.gate.read();
        let mut below: Vec<ReadOp<'_>> = Vec::new();
        // (this store's page, its bin) of each raw page in `below`.
        let mut raw: Vec<(u64, u64)> = Vec::new();
        let mut packed: Vec<(u64, u64, &mut [u8])> = Vec::new();
        {
            let map = self.map.lock();
            for op in ops.iter_mut() {
                for (i, buf) in op.buf.chunks_mut(PAGE_SIZE).enumerate() {
                    let page = op.page + i as u64;
                    match map.loc_of[page as usize] {
                        NONE => buf.fill(0),
                        at if span_of(at).1 == PAGE_SIZE => {
                            raw.push((page, u64::from(bin_of(at))));
                            below.push(ReadOp { page: u64::from(bin_of(at)), buf })
                        }
                        at => packed.push((page, at, buf)),
                    }
                }
            }
        }
        packed.sort_unstable_by_key(|&(_, at, _)| at);
        let mut bins: Vec<u32> = packed.iter().map(|&(_, at, _)| bin_of(at)).collect();
        bins.dedup();
        let mut scratch = vec![0u8; bins.len() * PAGE_SIZE];
        below.extend(
            bins.iter()
                .zip(scratch.chunks_mut(PAGE_SIZE))
                .map(|(&bin, buf)| ReadOp { page: u64::from(bin), buf }),
        );
        if below.is_empty() {
            return Ok(());
        }
        below.sort_unstable_by_key(|op| op.page);
        // A checked store below zeroes a page it cannot vouch for and
        // returns the rest. No raw page and no bin is all zeroes (a page of
        // zeroes takes no bin), so those that came back zeroed are the ones
        // that failed; the error names a page of this store.
        let mut result = Ok(());
        match self.inner.read(&mut below) {
            Ok(()) => {}
            Err(StoreError::Corrupt { .. }) => {
                raw.sort_unstable_by_key(|&(_, bin)| bin);
                for op in below.iter().filter(|op| op.buf.iter().all(|&b| b == 0)) {
                    if let Ok(i) = raw.binary_search_by_key(&op.page, |&(_, bin)| bin) {
                        result = result.and(Err(corrupt(raw[i].0, 0)));
                    }
                }
            }
            Err(e) => return Err(e),
        }
        drop(below);
        if packed.is_empty() {
            return result;
        }
        let mut engine = self.engine()?;
        for (page, at, buf) in packed {
            let slot = bins.binary_search(&bin_of(at)).expect("every packed page's bin was read");
            let bin = &scratch[slot * PAGE_SIZE..(slot + 1) * PAGE_SIZE];
            let (offset, len) = span_of(at);
            let got = engine.decompress(&bin[offset..offset + len], buf);
            if got != Ok(PAGE_SIZE) || bin.iter().all(|&b| b == 0) {
                // As a checked store does: this page zeroed, the rest returned.
                buf.fill(0);
                result = result.and(Err(corrupt(page, got.map_or(0, |n| n as u32))));
            }
        }
        self.engines.lock().push(engine);
        result
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        let pages: Vec<WriteOp<'_>> = ops
            .iter()
            .flat_map(|op| {
                let at = |(i, data)| WriteOp { page: op.page + i as u64, data };
                op.data.chunks(PAGE_SIZE).enumerate().map(at)
            })
            .collect();
        for chunk in pages.chunks(self.chunk_pages - CLEAN_BINS_MAX) {
            self.write_chunk(chunk)?;
        }
        Ok(())
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        {
            let mut map = self.map.lock();
            (page..page + count).for_each(|p| map.place(p, NONE));
        }
        self.release();
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }
}

impl<S: PageStore> Pack<S> {
    /// One chunk of a write, one op a page: compress, add the live entries
    /// of a few sparse bins (`clean.rs`), lay out, take bins, write them
    /// below, then point the map at them.
    fn write_chunk(&self, pages: &[WriteOp<'_>]) -> StoreResult<()> {
        let mut packed = Vec::new();
        let entries = self.classify(pages, &mut packed)?;
        let moved = self.gather_sparse(&mut packed);
        let items: Vec<(usize, usize)> = entries
            .iter()
            .filter_map(|e| {
                if let Entry::Packed { start, len } = *e {
                    Some((start, len))
                } else {
                    None
                }
            })
            .chain(moved.iter().map(|m| (m.start, m.len)))
            .collect();
        let (place, packed_bins) = lay_out(&items);
        let raw = entries.iter().filter(|e| matches!(e, Entry::Raw(_))).count();
        let bins = self.allocate(packed_bins.len() + raw)?;
        // Packed bins padded to a page; raw pages go from the caller's buffer.
        let mut padded = vec![0u8; packed_bins.len() * PAGE_SIZE];
        for (buf, &(start, end)) in padded.chunks_mut(PAGE_SIZE).zip(&packed_bins) {
            buf[..end - start].copy_from_slice(&packed[start..end]);
        }
        let (packed_at, raw_at) = bins.split_at(packed_bins.len());
        let mut below: Vec<WriteOp<'_>> = padded
            .chunks(PAGE_SIZE)
            .zip(packed_at)
            .map(|(data, &bin)| WriteOp { page: u64::from(bin), data })
            .collect();
        let raw_pages =
            entries.iter().filter_map(|e| if let Entry::Raw(d) = e { Some(*d) } else { None });
        below.extend(
            raw_pages.zip(raw_at).map(|(data, &bin)| WriteOp { page: u64::from(bin), data }),
        );
        below.sort_unstable_by_key(|op| op.page);
        if !below.is_empty() {
            if let Err(e) = self.inner.write(&below) {
                self.give_back(&bins);
                return Err(e);
            }
        }
        let at = Placed { packed_at, raw_at, place: &place };
        self.settle(pages, &entries, &moved, at);
        self.release();
        Ok(())
    }

    /// After the bins are down: every page of the write now lives there,
    /// and each moved entry too if its page was not written meanwhile.
    fn settle(
        &self,
        pages: &[WriteOp<'_>],
        entries: &[Entry<'_>],
        moved: &[Moved],
        at: Placed<'_>,
    ) {
        let mut raw_next = at.raw_at.iter();
        let mut places = at.place.iter();
        let mut map = self.map.lock();
        map.in_flight -= at.packed_at.len() + at.raw_at.len();
        self.settled.notify_all();
        let (mut zero, mut raw) = (0, 0);
        for (op, entry) in pages.iter().zip(entries) {
            let to = match *entry {
                Entry::Zero => {
                    zero += 1;
                    NONE
                }
                Entry::Raw(_) => {
                    raw += 1;
                    let bin = *raw_next.next().expect("a bin for every raw page");
                    map.hold(bin, PAGE_SIZE);
                    loc(bin, 0, PAGE_SIZE)
                }
                Entry::Packed { len, .. } => {
                    let &(bin_index, offset) = places.next().expect("a place for every entry");
                    map.hold(at.packed_at[bin_index], len);
                    loc(at.packed_at[bin_index], offset, len)
                }
            };
            map.place(op.page, to);
        }
        let mut kept = 0;
        for (m, &(bin_index, offset)) in moved.iter().zip(places) {
            if map.loc_of[m.page as usize] == m.old {
                map.hold(at.packed_at[bin_index], m.len);
                map.place(m.page, loc(at.packed_at[bin_index], offset, m.len));
                kept += 1;
            }
        }
        // A bin that held only entries rewritten meanwhile holds nothing.
        for &bin in at.packed_at {
            if map.live[bin as usize] == 0 {
                map.quarantine.push(bin);
            }
        }
        let c = &self.counts;
        c.pages_written.fetch_add(entries.len() as u64, Relaxed);
        c.bins_written.fetch_add((at.packed_at.len() + at.raw_at.len()) as u64, Relaxed);
        c.pages_raw.fetch_add(raw, Relaxed);
        c.pages_zero.fetch_add(zero, Relaxed);
        c.pages_moved.fetch_add(kept, Relaxed);
    }
}

/// Where a chunk's bins went: its packed bins, its raw ones, and each
/// packed entry's (bin index, offset), new entries first, then moved ones.
struct Placed<'a> {
    packed_at: &'a [u32],
    raw_at: &'a [u32],
    place: &'a [(usize, usize)],
}

/// `pack` over `base`: half its pages, compressed with `codec`.
fn named_with(
    base: Arc<dyn PageStore>,
    reports: &mut Vec<super::report::Report>,
    codec: Codec,
) -> StoreResult<Arc<dyn PageStore>> {
    let pages = pages_for(base.info().pages);
    let layer = Arc::new(Pack::new(base, pages, codec)?);
    let seen = Arc::clone(&layer);
    reports.push(Box::new(move || seen.summary()));
    Ok(layer)
}

pub(crate) fn named(
    base: Arc<dyn PageStore>,
    reports: &mut Vec<super::report::Report>,
) -> StoreResult<Arc<dyn PageStore>> {
    named_with(base, reports, Codec::Lz4)
}

pub(crate) fn named_zstd(
    base: Arc<dyn PageStore>,
    reports: &mut Vec<super::report::Report>,
) -> StoreResult<Arc<dyn PageStore>> {
    named_with(base, reports, Codec::Zstd)
}

#[path = "pack_clean.rs"]
mod clean;
use clean::Moved;

#[cfg(test)]
#[path = "pack_tests.rs"]
mod tests;
