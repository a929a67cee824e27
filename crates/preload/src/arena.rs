//! A page-granular allocator over the far region: free extents kept by
//! start (to coalesce) and by size (best fit), live blocks by start. Pure
//! bookkeeping; it never touches the memory it hands out.

use std::collections::{BTreeMap, BTreeSet};

/// A live allocation: `pages` pages from its start, of which the caller
/// asked for `size_bytes` (what `malloc_usable_size` and `realloc` need).
/// `mapped`: made by mmap, not malloc. Another allocator (jemalloc in
/// redis-server) may carve such a block into its own objects, whose frees
/// must go to it, not to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub pages: u64,
    pub size_bytes: u64,
    pub mapped: bool,
}

#[derive(Debug)]
pub struct Arena {
    free_by_start: BTreeMap<u64, u64>,
    free_by_size: BTreeSet<(u64, u64)>,
    live: BTreeMap<u64, Block>,
    live_pages: u64,
    peak_pages: u64,
}

impl Arena {
    pub fn new(pages: u64) -> Arena {
        let mut a = Arena {
            free_by_start: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            live: BTreeMap::new(),
            live_pages: 0,
            peak_pages: 0,
        };
        if pages > 0 {
            a.insert_free(0, pages);
        }
        a
    }

    pub fn live_pages(&self) -> u64 {
        self.live_pages
    }

    pub fn peak_pages(&self) -> u64 {
        self.peak_pages
    }

    pub fn block(&self, start: u64) -> Option<Block> {
        self.live.get(&start).copied()
    }

    /// Best fit for `pages` pages starting at a multiple of `align_pages`.
    pub fn alloc(
        &mut self,
        pages: u64,
        align_pages: u64,
        size_bytes: u64,
        mapped: bool,
    ) -> Option<u64> {
        debug_assert!(pages > 0 && align_pages.is_power_of_two());
        let start = self
            .free_by_size
            .range((pages, 0)..)
            .map(|&(len, start)| (start, start.next_multiple_of(align_pages), len))
            .find(|&(start, aligned, len)| aligned - start + pages <= len)
            .map(|(_, aligned, _)| aligned)?;
        self.carve(start, pages);
        self.add_live(start, Block { pages, size_bytes, mapped });
        Some(start)
    }

    /// Allocate exactly `[start, start + pages)` if all of it is free.
    pub fn alloc_at(&mut self, start: u64, pages: u64, size_bytes: u64, mapped: bool) -> bool {
        if !self.is_free(start, pages) {
            return false;
        }
        self.carve(start, pages);
        self.add_live(start, Block { pages, size_bytes, mapped });
        true
    }

    /// Grow or shrink the live block at `start` in place to `pages`. Growing
    /// needs the pages after it free; shrinking returns the tail, which the
    /// caller must discard. Returns the pages given back (0 when growing).
    pub fn resize(&mut self, start: u64, pages: u64, size_bytes: u64) -> Option<u64> {
        let block = self.live.get(&start).copied()?;
        if pages > block.pages {
            let more = pages - block.pages;
            if !self.is_free(start + block.pages, more) {
                return None;
            }
            self.carve(start + block.pages, more);
            self.live_pages += more;
            self.peak_pages = self.peak_pages.max(self.live_pages);
        } else if pages < block.pages {
            self.insert_free(start + pages, block.pages - pages);
            self.live_pages -= block.pages - pages;
        }
        self.live.insert(start, Block { pages, size_bytes, mapped: block.mapped });
        Some(block.pages.saturating_sub(pages))
    }

    /// Free the live block that starts at `start`; `None` if there is none.
    pub fn free(&mut self, start: u64) -> Option<Block> {
        let block = self.live.remove(&start)?;
        self.live_pages -= block.pages;
        self.insert_free(start, block.pages);
        Some(block)
    }

    /// Free whatever live pages lie in `[start, start + pages)`, splitting
    /// blocks that straddle its ends (munmap of part of a mapping). Calls
    /// `freed(start, pages)` for each run given back.
    pub fn free_range(&mut self, start: u64, pages: u64, mut freed: impl FnMut(u64, u64)) {
        let end = start + pages;
        let first = self.live.range(..=start).next_back().map(|(&s, _)| s).unwrap_or(start);
        let overlapping: Vec<(u64, Block)> =
            self.live.range(first..end).map(|(&s, &b)| (s, b)).collect();
        for (s, b) in overlapping {
            let (lo, hi) = (s.max(start), (s + b.pages).min(end));
            if lo >= hi {
                continue;
            }
            self.live.remove(&s);
            if s < lo {
                let pages = lo - s;
                self.live.insert(s, Block { pages, size_bytes: pages * 4096, mapped: b.mapped });
            }
            if hi < s + b.pages {
                let rest = s + b.pages - hi;
                self.live
                    .insert(hi, Block { pages: rest, size_bytes: rest * 4096, mapped: b.mapped });
            }
            self.live_pages -= hi - lo;
            self.insert_free(lo, hi - lo);
            freed(lo, hi - lo);
        }
    }

    /// Is every page of `[start, start + pages)` in live blocks made by
    /// mmap? (A MAP_FIXED over them replaces only what the program owns.)
    pub fn mapped_cover(&self, start: u64, pages: u64) -> bool {
        let end = start + pages;
        let first = self.live.range(..=start).next_back().map_or(start, |(&s, _)| s);
        let mut at = start;
        // Bounded by the live blocks between `first` and `end`.
        for (&s, b) in self.live.range(first..end) {
            if s > at {
                return false; // a gap
            }
            if !b.mapped && s + b.pages > at {
                return false;
            }
            at = at.max(s + b.pages);
            if at >= end {
                return true;
            }
        }
        at >= end
    }

    fn add_live(&mut self, start: u64, block: Block) {
        self.live.insert(start, block);
        self.live_pages += block.pages;
        self.peak_pages = self.peak_pages.max(self.live_pages);
    }

    fn is_free(&self, start: u64, pages: u64) -> bool {
        let Some((&s, &len)) = self.free_by_start.range(..=start).next_back() else {
            return false;
        };
        start + pages <= s + len
    }

    /// Take `[start, start + pages)` out of the free extent holding it.
    fn carve(&mut self, start: u64, pages: u64) {
        let (&s, &len) = self.free_by_start.range(..=start).next_back().expect("extent is free");
        assert!(start + pages <= s + len, "carving pages that are not free");
        self.remove_free(s, len);
        if s < start {
            self.put_free(s, start - s);
        }
        if start + pages < s + len {
            self.put_free(start + pages, s + len - start - pages);
        }
    }

    /// Add a free extent, joined with free neighbours on either side.
    fn insert_free(&mut self, mut start: u64, mut pages: u64) {
        if let Some((&s, &len)) = self.free_by_start.range(..start).next_back() {
            assert!(s + len <= start, "double free of page {start}");
            if s + len == start {
                self.remove_free(s, len);
                start = s;
                pages += len;
            }
        }
        if let Some(&len) = self.free_by_start.get(&(start + pages)) {
            self.remove_free(start + pages, len);
            pages += len;
        }
        self.put_free(start, pages);
    }

    fn put_free(&mut self, start: u64, pages: u64) {
        self.free_by_start.insert(start, pages);
        self.free_by_size.insert((pages, start));
    }

    fn remove_free(&mut self, start: u64, pages: u64) {
        self.free_by_start.remove(&start);
        self.free_by_size.remove(&(pages, start));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(a: &Arena, total: u64) {
        let free: u64 = a.free_by_start.values().sum();
        let live: u64 = a.live.values().map(|b| b.pages).sum();
        assert_eq!(free + live, total);
        assert_eq!(live, a.live_pages);
        assert_eq!(a.free_by_start.len(), a.free_by_size.len());
        let mut spans: Vec<(u64, u64)> = a.free_by_start.iter().map(|(&s, &l)| (s, l)).collect();
        spans.extend(a.live.iter().map(|(&s, b)| (s, b.pages)));
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {w:?}");
        }
    }

    #[test]
    fn alloc_free_coalesces_back_to_one_extent() {
        let mut a = Arena::new(1000);
        let x = a.alloc(100, 1, 1, false).unwrap();
        let y = a.alloc(200, 1, 1, false).unwrap();
        let z = a.alloc(300, 1, 1, false).unwrap();
        check(&a, 1000);
        a.free(y).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        check(&a, 1000);
        assert_eq!(a.free_by_start.len(), 1);
        assert!(a.free(z).is_none(), "a second free finds no block");
    }

    #[test]
    fn aligned_blocks_start_on_their_alignment() {
        let mut a = Arena::new(4096);
        a.alloc(3, 1, 1, false).unwrap();
        let x = a.alloc(10, 512, 1, false).unwrap();
        assert_eq!(x % 512, 0);
        check(&a, 4096);
    }

    #[test]
    fn a_munmapped_middle_splits_the_block() {
        let mut a = Arena::new(100);
        let x = a.alloc(50, 1, 50 * 4096, false).unwrap();
        let mut freed = Vec::new();
        a.free_range(x + 10, 20, |s, p| freed.push((s, p)));
        assert_eq!(freed, [(x + 10, 20)]);
        assert_eq!(a.block(x).unwrap().pages, 10);
        assert_eq!(a.block(x + 30).unwrap().pages, 20);
        assert_eq!(a.live_pages(), 30);
        check(&a, 100);
    }

    #[test]
    fn resize_grows_into_free_pages_and_shrinks() {
        let mut a = Arena::new(100);
        let x = a.alloc(10, 1, 1, false).unwrap();
        assert_eq!(a.resize(x, 30, 1), Some(0));
        let y = a.alloc(10, 1, 1, false).unwrap();
        assert_eq!(a.resize(x, 31, 1), None, "y is in the way");
        assert_eq!(a.resize(y, 4, 1), Some(6));
        check(&a, 100);
        assert!(a.alloc_at(y + 4, 6, 1, false));
        assert!(!a.alloc_at(y + 4, 1, 1, false));
        check(&a, 100);
    }

    #[test]
    fn a_cover_of_mapped_blocks_has_no_gap_and_no_malloc_block() {
        let mut a = Arena::new(100);
        assert!(a.alloc_at(10, 10, 1, true) && a.alloc_at(20, 5, 1, true));
        assert!(a.alloc_at(30, 5, 1, false));
        assert!(a.mapped_cover(12, 12), "across two touching mapped blocks");
        assert!(a.mapped_cover(10, 15));
        assert!(!a.mapped_cover(12, 14), "runs into the free page 25");
        assert!(!a.mapped_cover(9, 3), "starts on a free page");
        assert!(!a.mapped_cover(30, 2), "a malloc block");
    }

    #[test]
    fn exhaustion_returns_none() {
        let mut a = Arena::new(10);
        assert!(a.alloc(11, 1, 1, false).is_none());
        a.alloc(10, 1, 1, false).unwrap();
        assert!(a.alloc(1, 1, 1, false).is_none());
    }

    #[test]
    fn random_operations_keep_the_books_straight() {
        let mut a = Arena::new(10_000);
        let mut live = Vec::new();
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || live.is_empty() {
                if let Some(s) = a.alloc(1 + x % 97, 1 << (x % 4), 1, false) {
                    live.push(s);
                }
            } else {
                let s = live.swap_remove((x as usize / 3) % live.len());
                a.free(s).unwrap();
            }
        }
        check(&a, 10_000);
    }
}
