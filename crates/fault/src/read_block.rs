//! Neighbour reads: a fault from the store reads the aligned block of pages
//! around it in the same store call, maps the faulting page, then maps the
//! rest write-protected. Kernel swap does the same (`vm.page-cluster`).
//!
//! Programs that read an object a few cache lines at a time miss on several
//! pages of it in a row without any trend `trend.rs` could see: SQLite's
//! 64 KiB b-tree pages (header, cell pointers, a binary search over cells).
//! A trace of its point queries, replayed through LRU at a quarter of its
//! pages, missed 97 K times with single pages, 23 K with aligned blocks of
//! 8 and 16 K with 16; and lost to kernel swap, which reads 8 at a time.
//!
//! Neighbours are waste for programs whose neighbouring pages are unrelated
//! (redis values), and a read page is mapped where a reader never faults,
//! so use cannot be seen after the fact. It is measured beforehand
//! instead: some misses are *probes*, whose block is read page by page for
//! a while; the misses that later land in a probe's block are the faults a
//! block read would have saved, for each block size. Every
//! `EPOCH_PROBES` probes, the block size becomes the largest whose share of
//! neighbours that would have been used reaches `ACCURACY_MIN_PCT`; if
//! none does, neighbour reads stop (probes go on, so they start again when
//! the program changes). The reading and mapping are in `resolve.rs`.

/// The largest block read around a miss (64 KiB).
pub const READ_BLOCK_PAGES_MAX: usize = 16;
/// The block sizes weighed, in pages.
const SIZES: [usize; 4] = [2, 4, 8, 16];
/// Probes watched at once.
const PROBE_SLOTS: usize = 64;
/// One miss in this many is a probe while blocks are read: the rest get
/// their block. While none are, every miss outside a probed block is one
/// (they cost nothing then): a probe must be the first miss in its block,
/// as a block read would be, or it sees only the misses after it.
const PROBE_EVERY_ON: u64 = 8;
const PROBE_EVERY_OFF: u64 = 1;
/// A probe's block is watched for this many misses after it: long enough
/// to cover the accesses of one operation (a query touches its pages within
/// a few misses), short against the time a page read ahead stays mapped.
const PROBE_LIFE_MISSES: u64 = 256;
/// Probes per decision.
const EPOCH_PROBES: u32 = 64;
/// A block size is used if at least this share of its neighbour pages
/// would have been faulted on. Reading a neighbour costs little on the
/// wire (one request either way); mapping one that goes unused costs a
/// page of budget until eviction finds it.
const ACCURACY_MIN_PCT: u64 = 30;

/// What block reads own: the decision, and the pages read beside the
/// faulting one with their buffer (`None` if blocks are off).
pub(crate) struct Blocks {
    pub neighbours: Neighbours,
    pub buf: Option<crate::mem::PageBuf>,
    pub beside: Vec<u32>,
}

impl Blocks {
    /// Blocks of up to `pages_max` pages (below 2: none).
    pub(crate) fn new(pages_max: usize) -> std::io::Result<Blocks> {
        let pages_max = pages_max.min(READ_BLOCK_PAGES_MAX);
        let buf = match pages_max {
            0 | 1 => None,
            pages => Some(crate::mem::PageBuf::new(pages)?),
        };
        let beside = Vec::with_capacity(READ_BLOCK_PAGES_MAX);
        Ok(Blocks { neighbours: Neighbours::new(pages_max), buf, beside })
    }
}

#[derive(Clone, Copy, Default)]
struct Probe {
    page: u32,
    /// The miss count when it was taken; 0: the slot is empty.
    miss: u64,
}

/// Chooses, miss by miss, whether to read a block around it.
pub(crate) struct Neighbours {
    /// The largest block allowed (1: never read neighbours).
    pages_max: usize,
    /// The block read now (1: none).
    pages: usize,
    misses: u64,
    probes: [Probe; PROBE_SLOTS],
    next_slot: usize,
    epoch_probes: u32,
    /// Misses in a live probe's block, other than the probe's own page,
    /// that fell in the same aligned block of `SIZES[i]` pages.
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
            probes: [Probe::default(); PROBE_SLOTS],
            next_slot: 0,
            epoch_probes: 0,
            epoch_hits: [0; SIZES.len()],
        }
    }

    /// The block size in use now (1: none).
    pub(crate) fn block_pages(&self) -> usize {
        self.pages
    }

    /// A fault on `page` needs a store read: the aligned block to read
    /// around it (its first page and length), or `None` for the page alone.
    pub(crate) fn miss(&mut self, page: u32) -> Option<(u32, usize)> {
        if self.pages_max < 2 {
            return None;
        }
        self.misses += 1;
        if self.in_probed_block(page) {
            return None;
        }
        let every = if self.pages > 1 { PROBE_EVERY_ON } else { PROBE_EVERY_OFF };
        if self.misses.is_multiple_of(every) {
            self.probe(page);
            return None;
        }
        (self.pages > 1).then(|| (page - page % self.pages as u32, self.pages))
    }

    /// Whether `page` lies in the largest block of a live probe; counts the
    /// block sizes that would have brought it in with the probe's page.
    fn in_probed_block(&mut self, page: u32) -> bool {
        let widest = READ_BLOCK_PAGES_MAX as u32;
        let live = |p: &Probe| p.miss != 0 && self.misses - p.miss <= PROBE_LIFE_MISSES;
        let Some(probe) =
            self.probes.iter().copied().find(|p| live(p) && p.page / widest == page / widest)
        else {
            return false;
        };
        if probe.page != page {
            for (i, &size) in SIZES.iter().enumerate() {
                let size = size as u32;
                self.epoch_hits[i] += u64::from(probe.page / size == page / size);
            }
        }
        true
    }

    fn probe(&mut self, page: u32) {
        self.probes[self.next_slot] = Probe { page, miss: self.misses };
        self.next_slot = (self.next_slot + 1) % PROBE_SLOTS;
        self.epoch_probes += 1;
        if self.epoch_probes == EPOCH_PROBES {
            self.decide();
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

#[cfg(test)]
mod tests {
    use super::*;

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
                if let Some((first, len)) = neighbours.miss(page) {
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
            n.miss(i.wrapping_mul(2_654_435_761) % 10_000_000);
        }
        assert_eq!(n.block_pages(), 1);
    }

    #[test]
    fn they_turn_off_again_when_the_program_changes() {
        let mut n = Neighbours::new(READ_BLOCK_PAGES_MAX);
        run(&mut n, 20_000, 6);
        assert!(n.block_pages() > 1);
        for i in 0..100_000u32 {
            n.miss(i.wrapping_mul(2_654_435_761) % 10_000_000);
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
