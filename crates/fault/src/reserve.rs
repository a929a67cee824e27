//! The part of the budget kept back from mapped pages for the handler's own
//! buffers, counted as they are used.
//!
//! While the region holds more pages than its budget, mapped pages, staged
//! victims and prefetch windows together stay within it. The staging halves
//! hold room for two of the largest batches (1024 pages each) and the window
//! buffers three of the largest windows (512 pages each): 14 MiB, which a
//! fixed reserve kept out of a ~94 MiB far budget under `memlend run --mem
//! 128M` (redis, memcached), unused while batches were 10-20 pages and
//! windows rare. Now the reserve is what the buffers hold or may take next:
//!
//! - staging: two halves at the batch size now, or what the halves hold if
//!   more (a batch taken before the size shrank). Eviction moves a page from
//!   mapped to staged, so a batch within that room frees mapped budget at
//!   once, as with the fixed reserve;
//! - windows: the most pages each window buffer was ever sent (nothing gives
//!   a window buffer's memory back). A window that grows one is counted when
//!   it is sent, before room is made for its pages.
//!
//! Never more than the fixed reserve it replaces.

/// The staging mapping's halves: eviction fills one while the write-back
/// thread writes the other (`evict/writeback.rs`).
pub(crate) const HALVES: usize = 2;

pub(crate) struct Reserve {
    /// The fixed reserve: every buffer at its largest, at most a quarter of
    /// the configured budget.
    max_pages: usize,
    /// The eviction batch's size now.
    batch_pages: usize,
    /// Pages moved into each staging half and not yet cleared out of it.
    staged_pages: [usize; HALVES],
    /// Pages the window buffers hold: each one's most ever sent, summed.
    window_pages: usize,
}

impl Reserve {
    pub(crate) fn new(max_pages: usize, batch_pages: usize) -> Reserve {
        Reserve { max_pages, batch_pages, staged_pages: [0; HALVES], window_pages: 0 }
    }

    /// The pages to keep out of the mapped ones now.
    pub(crate) fn pages(&self) -> usize {
        let staged: usize = self.staged_pages.iter().sum();
        let staging = staged.max(HALVES * self.batch_pages);
        (staging + self.window_pages).min(self.max_pages)
    }

    /// Of the reserve, the pages the buffers hold now: staged victims, and
    /// what the window buffers hold (their most ever: never given back).
    /// The rest of it is room, not memory.
    pub(crate) fn held_pages(&self) -> usize {
        self.staged_pages.iter().sum::<usize>() + self.window_pages
    }

    /// The fixed reserve (every buffer at its largest).
    pub(crate) fn max_pages(&self) -> usize {
        self.max_pages
    }

    pub(crate) fn set_batch_pages(&mut self, pages: usize) {
        self.batch_pages = pages;
    }

    /// `half` now holds `pages` (0 once cleared).
    pub(crate) fn set_staged(&mut self, half: usize, pages: usize) {
        self.staged_pages[half] = pages;
    }

    /// A window buffer came to hold `pages` more than it ever had.
    pub(crate) fn window_grew(&mut self, pages: usize) {
        self.window_pages += pages;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_the_buffers_hold_or_may_take_next_and_never_past_the_max() {
        let mut r = Reserve::new(3584, 32);
        assert_eq!(r.pages(), 64, "room for a batch in each half");
        r.set_staged(0, 32);
        assert_eq!(r.pages(), 64, "a batch within that room frees mapped budget");
        r.set_batch_pages(16);
        r.set_staged(1, 40);
        assert_eq!(r.pages(), 72, "halves holding more than the room are counted");
        assert_eq!(r.held_pages(), 72, "what the halves hold is memory");
        r.set_staged(0, 0);
        r.set_staged(1, 0);
        r.window_grew(512);
        assert_eq!(r.pages(), 32 + 512);
        assert_eq!(r.held_pages(), 512, "empty halves hold nothing; windows keep theirs");
        r.set_batch_pages(1024);
        r.window_grew(2 * 512);
        assert_eq!(r.pages(), 3584, "capped at the fixed reserve");
        assert_eq!(r.max_pages(), 3584);
    }
}
