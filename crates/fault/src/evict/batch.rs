//! How many pages an eviction batch takes. Each batch is one store write.
//! On a fast store (RAM, the SSD file, a donor on the LAN) a small batch
//! keeps the wait of a fault behind it short. On a slow one (a donor 40 ms
//! away) a batch costs a round trip whatever its size, so small batches cap
//! write-back at a few hundred pages a second. So the size doubles after a
//! write slow by its latency and halves after a fast one, between the
//! configured size and a maximum.
//!
//! A write fast in all (under `FAST_WRITE`) shrinks the batch whatever its
//! size: the store's latency is low. One fast per page only shrinks it if
//! it was near a full batch.
//!
//! Slow means slow per page as well as in all: a 1024-page write to a
//! loopback donor takes 2-4 ms by its bytes alone, and judged by its time
//! alone it kept the batch at 1024 for good once a few writes had waited
//! for a core on a busy machine. A fault that found no free page then moved
//! ~900 pages out while memcached's four workers waited (store-fault p99.9
//! 3.5-4.5 ms in the runs caught in that state, 0.44 ms in the others).

use std::time::Duration;

/// A write at least this slow is dominated by latency: batch more.
const SLOW_WRITE: Duration = Duration::from_millis(2);
/// A write this fast needs no more than the base batch.
const FAST_WRITE: Duration = Duration::from_micros(500);
/// A slow write grows the batch only if it took at least this long a page
/// (latency, not bytes); one under `FAST_PAGE` a page is bound by its bytes,
/// and a smaller batch writes as fast.
const SLOW_PAGE: Duration = Duration::from_micros(20);
const FAST_PAGE: Duration = Duration::from_micros(5);
/// The most pages one adaptive batch may take, and at most this share of
/// the budget: the staging halves are sized for it. The budget keeps room
/// out of the mapped pages for two batches of the size now (`reserve.rs`).
pub(crate) const BATCH_PAGES_MAX: usize = 1024;
const BUDGET_SHARE_MAX: usize = 16;

#[derive(Debug)]
pub(crate) struct BatchSize {
    now: usize,
    base: usize,
    max: usize,
}

impl BatchSize {
    pub(crate) fn new(base: usize, budget_pages: usize) -> BatchSize {
        assert!(base >= 1, "checked by the region's config");
        let max = BATCH_PAGES_MAX.min(budget_pages / BUDGET_SHARE_MAX).max(base);
        BatchSize { now: base, base, max }
    }

    pub(crate) fn pages(&self) -> usize {
        self.now
    }

    /// The most `pages` can ever be: the staging mapping's size.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Whether the store has proved slow (batches above the base).
    pub(crate) fn slow(&self) -> bool {
        self.now > self.base
    }

    /// A write-back of `written` pages took `took`.
    pub(crate) fn observe(&mut self, written: usize, took: Duration) {
        let per_page = took / u32::try_from(written.max(1)).unwrap_or(u32::MAX);
        if took >= SLOW_WRITE && per_page >= SLOW_PAGE {
            self.now = (self.now * 2).min(self.max);
        } else if took <= FAST_WRITE || (per_page <= FAST_PAGE && written * 2 >= self.now) {
            self.now = (self.now / 2).max(self.base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_on_slow_writes_shrinks_on_fast_ones_within_bounds() {
        let mut b = BatchSize::new(32, 65536);
        assert_eq!((b.pages(), b.max(), b.slow()), (32, 1024, false));
        for _ in 0..10 {
            b.observe(b.pages(), Duration::from_millis(40));
        }
        assert_eq!(b.pages(), 1024);
        assert!(b.slow());
        // A write fast in all, however small, shows a store whose latency
        // needs no batch: a read-only phase after a slow load writes a few
        // dirty pages at a time, and the room kept for two 1024-page
        // batches was 8 MiB of a redis's budget.
        b.observe(8, Duration::from_micros(100));
        assert_eq!(b.pages(), 512);
        // Fast by its bytes only counts for a batch near full.
        b.observe(8, Duration::from_micros(900));
        assert_eq!(b.pages(), 512);
        for _ in 0..10 {
            b.observe(b.pages(), Duration::from_micros(100));
        }
        assert_eq!(b.pages(), 32);
        // In between: nothing changes.
        b.observe(32, Duration::from_millis(1));
        assert_eq!(b.pages(), 32);
    }

    #[test]
    fn writes_slow_by_their_bytes_do_not_grow_the_batch() {
        let mut b = BatchSize::new(32, 65536);
        // A busy core: every write waits ~2 ms, whatever its size. The batch
        // grows while that is most of a page's cost, and stops growing there.
        for _ in 0..20 {
            let took = Duration::from_millis(2) + Duration::from_micros(2) * b.pages() as u32;
            b.observe(b.pages(), took);
        }
        assert_eq!(b.pages(), 128);
        // A full batch written at 3 us a page shrinks back.
        let mut b = BatchSize::new(32, 65536);
        for _ in 0..10 {
            b.observe(b.pages(), Duration::from_millis(40));
        }
        assert_eq!(b.pages(), 1024);
        b.observe(1024, Duration::from_millis(3));
        assert_eq!(b.pages(), 512);
    }

    #[test]
    fn a_small_budget_caps_the_batch_but_never_below_the_base() {
        assert_eq!(BatchSize::new(32, 4096).max(), 256);
        assert_eq!(BatchSize::new(32, 64).max(), 32);
    }
}
