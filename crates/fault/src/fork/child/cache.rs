//! Which pages a forked child keeps mapped of those it read in: S3-FIFO
//! without hit bits (the child sees no read of a mapped page), as the
//! parent's handler does ("Replacement" in DESIGN.md).
//!
//! Why: redis's BGSAVE visits each key once, but each key touches a value
//! page used once and three pages of small objects (dict entry, key, object
//! header) shared by the hundreds of keys allocated near it. Plain FIFO
//! over a sixteenth of the parent's budget dropped those shared pages
//! between uses: the child read 1.0 M pages through its parent for a
//! dataset of 131 K (by hand, redis at 50/50 in a 258 MiB memcg). A page read
//! again soon after it was dropped (a ghost) goes to the main queue, which
//! has most of the budget; pages read once pass through the small one.

use std::collections::VecDeque;

/// The small queue's share of the budget: one in this many pages.
const SMALL_SHARE: usize = 10;

pub(crate) struct ChildCache {
    budget_pages: usize,
    small: VecDeque<u32>,
    main: VecDeque<u32>,
    /// Pages dropped lately, oldest first; at most `budget_pages`.
    ghosts: VecDeque<u32>,
    /// One bit a page: in `ghosts`.
    ghost_bits: Vec<u64>,
}

impl ChildCache {
    pub(crate) fn new(pages: u32, budget_pages: usize) -> ChildCache {
        ChildCache {
            budget_pages: budget_pages.max(1),
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghosts: VecDeque::new(),
            ghost_bits: vec![0; (pages as usize).div_ceil(64)],
        }
    }

    /// `page` was read in (it was not mapped).
    pub(crate) fn read_in(&mut self, page: u32) {
        if self.ghost(page) {
            self.set_ghost(page, false);
            self.main.push_back(page);
        } else {
            self.small.push_back(page);
        }
    }

    /// The next page to drop while more than the budget are kept. It leaves
    /// the cache (a written one is then kept mapped by the caller, for good).
    pub(crate) fn victim(&mut self) -> Option<u32> {
        if self.small.len() + self.main.len() <= self.budget_pages {
            return None;
        }
        let small_max = (self.budget_pages / SMALL_SHARE).max(1);
        let page = if self.small.len() > small_max || self.main.is_empty() {
            self.small.pop_front()
        } else {
            self.main.pop_front()
        }?;
        self.remember(page);
        Some(page)
    }

    fn remember(&mut self, page: u32) {
        if self.ghosts.len() >= self.budget_pages {
            if let Some(old) = self.ghosts.pop_front() {
                self.set_ghost(old, false);
            }
        }
        self.ghosts.push_back(page);
        self.set_ghost(page, true);
    }

    fn ghost(&self, page: u32) -> bool {
        self.ghost_bits.get(page as usize / 64).is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    fn set_ghost(&mut self, page: u32, on: bool) {
        if let Some(w) = self.ghost_bits.get_mut(page as usize / 64) {
            if on {
                *w |= 1 << (page % 64);
            } else {
                *w &= !(1 << (page % 64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drops(cache: &mut ChildCache) -> Vec<u32> {
        std::iter::from_fn(|| cache.victim()).collect()
    }

    #[test]
    fn pages_read_again_after_a_drop_outlive_pages_read_once() {
        let mut cache = ChildCache::new(1000, 20);
        // Pages 0..4 are read, dropped by a scan of 100..130 (14 drops, so
        // they are still ghosts), then read again.
        (0..4).for_each(|p| cache.read_in(p));
        (100..130).for_each(|p| {
            cache.read_in(p);
            drops(&mut cache);
        });
        (0..4).for_each(|p| cache.read_in(p));
        // Another long scan: the pages read twice stay, the scan passes.
        let mut dropped = Vec::new();
        (200..300).for_each(|p| {
            cache.read_in(p);
            dropped.extend(drops(&mut cache));
        });
        assert!(dropped.iter().all(|&p| p >= 100), "a page read twice was dropped: {dropped:?}");
        assert!(cache.small.len() + cache.main.len() <= 20);
    }

    #[test]
    fn nothing_is_dropped_within_the_budget() {
        let mut cache = ChildCache::new(64, 8);
        (0..8).for_each(|p| cache.read_in(p));
        assert_eq!(cache.victim(), None);
        cache.read_in(8);
        assert_eq!(cache.victim(), Some(0), "the oldest page read once");
    }
}
