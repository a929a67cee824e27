//! Neighbour reads: a fault from the store reads the aligned block of pages
//! around it in the same store call, maps the faulting page, then maps the
//! rest write-protected. Kernel swap does the same (`vm.page-cluster`).
//!
//! Programs that read an object a few cache lines at a time miss on several
//! pages of it in a row without any trend `prefetch/trend.rs` could see: SQLite's
//! 64 KiB b-tree pages (header, cell pointers, a binary search over cells).
//! A trace of its point queries, replayed through LRU at a quarter of its
//! pages, missed 97 K times with single pages, 23 K with aligned blocks of
//! 8 and 16 K with 16; and lost to kernel swap, which reads 8 at a time.
//!
//! Neighbours are waste for programs whose neighbouring pages are unrelated
//! (redis values), and a read page is mapped where a reader never faults,
//! so use cannot be seen after the fact. It is measured beside instead:
//! one aligned 16-page block in `CONTROL_SHARE` is a *control* block,
//! never read as a block. Its first miss starts a probe; its later misses,
//! while the probe lives, are the faults a block read at that first miss
//! would have saved, for each block size. A probe lives about as long as
//! the pages read beside it would stay mapped: half the budget's worth of
//! misses. (A horizon of one operation, 256 misses, measured 12% of the
//! neighbours used in SQLite's steady state; half the budget, 34%; a
//! replay of its trace through LRU at half its pages missed 232 K times
//! with single pages and 110 K with blocks of 16.) Every `EPOCH_PROBES`
//! probes that ended, the block size becomes the largest whose share of
//! neighbours used reaches `ACCURACY_MIN_PCT`, or none. While none is read,
//! every block is a control block. The reading and mapping are in
//! `handler/resolve.rs`.
//!
//! Off by default (`Tuning::read_block_pages_max` 0), because on these
//! 2-core machines, donor on the same host, they do not pay: SQLite at half
//! its memory took 42% fewer store faults with blocks of 16 and ran 24%
//! slower (7.8 K queries/s against 10.3 K), each of the 15 pages beside a
//! miss costing the donor, the decryption and an eviction their CPU. Read
//! on a fetch thread instead of in the fault's own read, 55% fewer faults,
//! 40% slower. They are for stores where a round trip costs more than
//! moving 60 KiB more (a donor across a real network, an SSD).

use std::collections::{HashMap, VecDeque};

/// The largest block read around a miss (64 KiB).
pub const READ_BLOCK_PAGES_MAX: usize = 16;
/// The block sizes weighed, in pages.
const SIZES: [usize; 4] = [2, 4, 8, 16];
/// One 16-page block in this many is a control block while blocks are read.
const CONTROL_SHARE: u32 = 8;
/// A probe lives for the misses of half the budget, within these bounds.
const PROBE_LIFE_MISSES_MIN: u64 = 256;
const PROBE_LIFE_MISSES_MAX: u64 = 1 << 16;
/// Live probes at most (a map entry and a queue entry each, ~40 bytes);
/// past it the oldest ends early.
const PROBES_MAX: usize = 16_384;
/// Ended probes per decision.
const EPOCH_PROBES: u32 = 256;
/// A block size is used if at least this share of its neighbour pages
/// would have been faulted on. Reading a neighbour costs little on the
/// wire (one request either way); mapping one that goes unused costs a
/// page of budget until eviction finds it.
const ACCURACY_MIN_PCT: u64 = 30;

/// Most other faults whose pages ride along with one fault's store read:
/// one read of the uffd returns at most 16 messages.
pub(crate) const COMPANIONS_MAX: usize = 15;

/// What block reads own: the decision, and the pages read beside the
/// faulting one with their buffer (`None` if blocks are off); and the
/// other faults of the same batch of messages (`companions`, page and
/// whether a write) whose pages may ride along with a fault's store read,
/// with their buffer (`None` if that is off) and those riding now.
pub(crate) struct Blocks {
    pub neighbours: Neighbours,
    pub buf: Option<crate::kernel::mem::PageBuf>,
    pub beside: Vec<u32>,
    pub companions: Vec<(u32, bool)>,
    pub companion_buf: Option<crate::kernel::mem::PageBuf>,
    pub riding: Vec<(u32, bool)>,
}

impl Blocks {
    /// Blocks of up to `pages_max` pages (below 2: none); companions if
    /// `batch_faults`.
    pub(crate) fn new(pages_max: usize, batch_faults: bool) -> std::io::Result<Blocks> {
        let pages_max = pages_max.min(READ_BLOCK_PAGES_MAX);
        let buf = match pages_max {
            0 | 1 => None,
            pages => Some(crate::kernel::mem::PageBuf::new(pages)?),
        };
        let companion_buf =
            batch_faults.then(|| crate::kernel::mem::PageBuf::new(COMPANIONS_MAX)).transpose()?;
        Ok(Blocks {
            neighbours: Neighbours::new(pages_max),
            buf,
            beside: Vec::with_capacity(READ_BLOCK_PAGES_MAX),
            companions: Vec::with_capacity(COMPANIONS_MAX + 1),
            companion_buf,
            riding: Vec::with_capacity(COMPANIONS_MAX),
        })
    }
}

#[derive(Clone, Copy)]
struct Probe {
    page: u32,
    /// The miss count when it began.
    miss: u64,
    /// Later misses in its block within a block of `SIZES[i]` pages of it.
    hits: [u16; SIZES.len()],
}

/// Chooses, miss by miss, whether to read a block around it.
pub(crate) struct Neighbours {
    /// The largest block allowed (1: never read neighbours).
    pages_max: usize,
    /// The block read now (1: none).
    pages: usize,
    misses: u64,
    /// Live probes by 16-page block, and their blocks oldest first (an
    /// entry whose probe was replaced is stale: its `miss` differs).
    probes: HashMap<u32, Probe>,
    order: VecDeque<(u32, u64)>,
    epoch_probes: u32,
    epoch_hits: [u64; SIZES.len()],
}

impl Neighbours {
    /// `pages_max` is rounded down to a block size; below 2 turns reads off.
    pub(crate) fn new(pages_max: usize) -> Neighbours {
        let pages_max = SIZES.iter().copied().filter(|&s| s <= pages_max).max().unwrap_or(1);
        Neighbours {
            pages_max,
            pages: 1,
            misses: 0,
            probes: HashMap::new(),
            order: VecDeque::new(),
            epoch_probes: 0,
            epoch_hits: [0; SIZES.len()],
        }
    }

    /// The block size in use now (1: none).
    pub(crate) fn block_pages(&self) -> usize {
        self.pages
    }

    /// A fault on `page` needs a store read, with `budget_pages` mapped at
    /// most: the aligned block to read around it (its first page and
    /// length), or `None` for the page alone.
    pub(crate) fn miss(&mut self, page: u32, budget_pages: usize) -> Option<(u32, usize)> {
        if self.pages_max < 2 {
            return None;
        }
        self.misses += 1;
        let life = (budget_pages as u64 / 2).clamp(PROBE_LIFE_MISSES_MIN, PROBE_LIFE_MISSES_MAX);
        self.end_probes(life);
        let block = page / READ_BLOCK_PAGES_MAX as u32;
        if self.pages > 1 && !is_control(block) {
            return Some((page - page % self.pages as u32, self.pages));
        }
        match self.probes.get_mut(&block) {
            Some(probe) => count(probe, page),
            None => self.start_probe(block, page),
        }
        None
    }

    fn start_probe(&mut self, block: u32, page: u32) {
        if self.probes.len() == PROBES_MAX {
            self.end_oldest();
        }
        self.probes.insert(block, Probe { page, miss: self.misses, hits: [0; SIZES.len()] });
        self.order.push_back((block, self.misses));
    }

    /// End the probes older than `life` misses.
    fn end_probes(&mut self, life: u64) {
        // Bounded by the queue, which holds at most one entry per probe
        // started and loses one per turn.
        while self.order.front().is_some_and(|&(_, miss)| self.misses - miss > life) {
            self.end_oldest();
        }
    }

    fn end_oldest(&mut self) {
        let Some((block, miss)) = self.order.pop_front() else { return };
        if self.probes.get(&block).is_some_and(|p| p.miss == miss) {
            let probe = self.probes.remove(&block).expect("just found");
            for (total, &hits) in self.epoch_hits.iter_mut().zip(&probe.hits) {
                *total += u64::from(hits);
            }
            self.epoch_probes += 1;
            if self.epoch_probes == EPOCH_PROBES {
                self.decide();
            }
        }
    }

    /// The largest allowed block size whose neighbours would mostly have
    /// been used; then a fresh epoch.
    fn decide(&mut self) {
        let probes = u64::from(self.epoch_probes);
        let useful = |i: usize| {
            let neighbours = probes * (SIZES[i] as u64 - 1);
            self.epoch_hits[i] * 100 >= neighbours * ACCURACY_MIN_PCT
        };
        self.pages = (0..SIZES.len())
            .rev()
            .find(|&i| SIZES[i] <= self.pages_max && useful(i))
            .map_or(1, |i| SIZES[i]);
        self.epoch_probes = 0;
        self.epoch_hits = [0; SIZES.len()];
    }
}

/// Whether a 16-page block is a control block while blocks are read: a
/// fixed share, spread over the region by a multiplicative hash.
fn is_control(block: u32) -> bool {
    (block.wrapping_mul(0x9E37_79B9) >> 16).is_multiple_of(CONTROL_SHARE)
}

/// A miss on `page` in a live probe's block: which block sizes would have
/// brought it in with the probe's page.
fn count(probe: &mut Probe, page: u32) {
    if probe.page == page {
        return;
    }
    for (hits, &size) in probe.hits.iter_mut().zip(&SIZES) {
        let size = size as u32;
        *hits = hits.saturating_add(u16::from(probe.page / size == page / size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET_PAGES: usize = 512;

    /// Misses on `per_object` pages of each 16-page object, objects in a
    /// scattered order, each evicted before the next; how many misses got
    /// a block read.
    fn run(neighbours: &mut Neighbours, objects: u32, per_object: u32) -> usize {
        let mut mapped = std::collections::HashSet::new();
        let mut blocks = 0;
        for i in 0..objects {
            let object = i.wrapping_mul(2_654_435_761) % 100_000;
            mapped.clear();
            for k in 0..per_object {
                let page = object * 16 + (k * 5) % 16;
                if !mapped.insert(page) {
                    continue;
                }
                if let Some((first, len)) = neighbours.miss(page, BUDGET_PAGES) {
                    assert_eq!(first % len as u32, 0, "blocks are aligned");
                    assert!(page >= first && page < first + len as u32);
                    mapped.extend(first..first + len as u32);
                    blocks += 1;
                }
            }
        }
        blocks
    }

    #[test]
    fn objects_read_in_pieces_turn_block_reads_on() {
        let mut n = Neighbours::new(READ_BLOCK_PAGES_MAX);
        assert!(run(&mut n, 20_000, 6) > 0);
        assert!(n.block_pages() >= 8, "block {}", n.block_pages());
    }

    #[test]
    fn scattered_single_pages_keep_them_off() {
        let mut n = Neighbours::new(READ_BLOCK_PAGES_MAX);
        for i in 0..100_000u32 {
            n.miss(i.wrapping_mul(2_654_435_761) % 10_000_000, BUDGET_PAGES);
        }
        assert_eq!(n.block_pages(), 1);
    }

    #[test]
    fn they_turn_off_again_when_the_program_changes() {
        let mut n = Neighbours::new(READ_BLOCK_PAGES_MAX);
        run(&mut n, 20_000, 6);
        assert!(n.block_pages() > 1);
        for i in 0..100_000u32 {
            n.miss(i.wrapping_mul(2_654_435_761) % 10_000_000, BUDGET_PAGES);
        }
        assert_eq!(n.block_pages(), 1);
    }

    #[test]
    fn the_cap_is_kept_and_below_two_pages_means_never() {
        let mut n = Neighbours::new(4);
        run(&mut n, 20_000, 8);
        assert_eq!(n.block_pages(), 4);
        let mut off = Neighbours::new(1);
        assert_eq!(run(&mut off, 20_000, 8), 0);
        assert_eq!(off.block_pages(), 1);
    }
}
