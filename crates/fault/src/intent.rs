//! Whether a page read from the store is mapped write-protected (`Clean`)
//! or writable (`Dirty`).
//!
//! `Clean` saves a write-back if the page is never written before it is
//! evicted, but its first write costs a WP fault: a round trip through the
//! handler (about 10-14 µs measured here, see DESIGN.md, more when the
//! writer and the handler are on different cores). `Dirty` costs no fault,
//! but the page is written back on eviction whether or not it changed. So
//! with `r` the share of `Clean` pages written before eviction, mapping
//! writable pays off when `r · wp_cost > (1 − r) · writeback_cost`. Both
//! sides are measured as the region runs: `r` from WP faults and clean
//! drops, the write-back cost per page from eviction batches. One fill in
//! `SAMPLE_EVERY` stays `Clean` whatever the choice, so `r` keeps being
//! measured after the choice flips to writable.

use std::time::Duration;

/// A WP fault's cost, from `tests/wp_async.rs` (DESIGN.md): the handler's
/// side plus the writer's two context switches.
const WP_FAULT_COST: Duration = Duration::from_micros(12);
/// Fills mapped `Clean` whatever the estimate, one in this many.
const SAMPLE_EVERY: u32 = 8;
/// Pages of a sampled prefetch window mapped `Clean` (its head).
const WINDOW_SAMPLE_PAGES: usize = 8;
/// Outcomes remembered: past this many the counts are halved, so the
/// estimate follows a change of phase within a few hundred evictions.
const WINDOW: u32 = 512;
/// Until a write-back was timed, assume this per page (a batch over
/// loopback; a slow link raises it at the first eviction).
const WRITEBACK_COST_GUESS: Duration = Duration::from_micros(4);

#[derive(Debug)]
pub(crate) struct WriteIntent {
    /// `Clean` pages written before eviction, and evicted unwritten.
    written: u32,
    unwritten: u32,
    /// Running average (weight 1/8) of a write-back's cost per page, ns.
    writeback_ns_per_page: u64,
    fills: u32,
    enabled: bool,
}

impl WriteIntent {
    /// `enabled: false` maps every store page `Clean` (for measuring what
    /// mapping writable saves).
    pub(crate) fn new(enabled: bool) -> WriteIntent {
        WriteIntent {
            written: 0,
            unwritten: 0,
            writeback_ns_per_page: WRITEBACK_COST_GUESS.as_nanos() as u64,
            fills: 0,
            enabled,
        }
    }

    /// A write faulted on a `Clean` page.
    pub(crate) fn written(&mut self) {
        self.written += 1;
        self.decay();
    }

    /// `pages` `Clean` pages were evicted unwritten.
    pub(crate) fn unwritten(&mut self, pages: usize) {
        self.unwritten = self.unwritten.saturating_add(pages.min(WINDOW as usize) as u32);
        self.decay();
    }

    /// An eviction wrote `pages` pages in `took`.
    pub(crate) fn wrote_back(&mut self, pages: usize, took: Duration) {
        if pages == 0 {
            return;
        }
        let per_page = (took.as_nanos() / pages as u128).min(u64::MAX as u128) as u64;
        self.writeback_ns_per_page = (self.writeback_ns_per_page * 7 + per_page) / 8;
    }

    /// Whether the next page filled from the store by a read fault should
    /// be mapped writable.
    pub(crate) fn map_writable(&mut self) -> bool {
        self.fills = self.fills.wrapping_add(1);
        !self.fills.is_multiple_of(SAMPLE_EVERY) && self.writable_pays()
    }

    /// Of a prefetch window of `pages` (mapped in page order), how many at
    /// its head to map `Clean`; the rest go writable. A sampled window
    /// keeps only `WINDOW_SAMPLE_PAGES` `Clean`: a whole one, 512 pages at
    /// 50% writes, cost 256 WP faults, and one window in eight made that
    /// 32 a window, 6% of a scan's pages (1 fault per 24 pages measured,
    /// each a switch to the handler and back).
    pub(crate) fn window_clean_pages(&mut self, pages: usize) -> usize {
        self.fills = self.fills.wrapping_add(1);
        if !self.writable_pays() {
            pages
        } else if self.fills.is_multiple_of(SAMPLE_EVERY) {
            pages.min(WINDOW_SAMPLE_PAGES)
        } else {
            0
        }
    }

    fn writable_pays(&self) -> bool {
        let (w, u) = (u64::from(self.written), u64::from(self.unwritten));
        let wp_ns = WP_FAULT_COST.as_nanos() as u64;
        self.enabled && w * wp_ns > u * self.writeback_ns_per_page
    }

    fn decay(&mut self) {
        if self.written + self.unwritten > WINDOW {
            self.written /= 2;
            self.unwritten /= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writable_share(intent: &mut WriteIntent) -> usize {
        (0..800).filter(|_| intent.map_writable()).count()
    }

    #[test]
    fn pages_that_get_written_are_mapped_writable_but_some_are_still_sampled() {
        let mut intent = WriteIntent::new(true);
        assert_eq!(writable_share(&mut intent), 0, "no evidence yet");
        (0..300).for_each(|_| intent.written());
        intent.unwritten(300);
        // 50% written, a WP fault (12 µs) dearer than a write-back (4 µs).
        assert_eq!(writable_share(&mut intent), 700, "all but the 1-in-8 sample");
    }

    #[test]
    fn rarely_written_pages_stay_clean() {
        let mut intent = WriteIntent::new(true);
        (0..20).for_each(|_| intent.written());
        intent.unwritten(400);
        assert_eq!(writable_share(&mut intent), 0);
    }

    #[test]
    fn a_slow_write_back_raises_the_bar() {
        let mut intent = WriteIntent::new(true);
        (0..250).for_each(|_| intent.written());
        intent.unwritten(250);
        assert!(writable_share(&mut intent) > 0);
        // A donor far away: 40 µs a page. Half written no longer pays.
        (0..64).for_each(|_| intent.wrote_back(1024, Duration::from_millis(40)));
        assert_eq!(writable_share(&mut intent), 0);
    }

    #[test]
    fn the_estimate_follows_a_change_of_phase() {
        let mut intent = WriteIntent::new(true);
        (0..400).for_each(|_| intent.written());
        assert!(writable_share(&mut intent) > 0);
        for _ in 0..20 {
            intent.unwritten(100);
        }
        assert_eq!(writable_share(&mut intent), 0);
    }

    #[test]
    fn a_window_keeps_a_small_sample_clean_once_writing_pays() {
        let mut intent = WriteIntent::new(true);
        assert_eq!(intent.window_clean_pages(512), 512, "no evidence yet");
        (0..300).for_each(|_| intent.written());
        intent.unwritten(300);
        let clean: Vec<usize> = (0..16).map(|_| intent.window_clean_pages(512)).collect();
        assert_eq!(clean.iter().filter(|&&c| c == WINDOW_SAMPLE_PAGES).count(), 2, "{clean:?}");
        assert_eq!(clean.iter().filter(|&&c| c == 0).count(), 14, "{clean:?}");
    }

    #[test]
    fn disabled_means_always_clean() {
        let mut intent = WriteIntent::new(false);
        (0..400).for_each(|_| intent.written());
        assert_eq!(writable_share(&mut intent), 0);
        assert_eq!(intent.window_clean_pages(512), 512);
    }
}
