//! Write-back failures: logged once, then summed per interval, and met
//! with a growing pause before eviction tries again.

use memlend_store::StoreError;
use std::time::{Duration, Instant};

/// Repeats of a write-back failure are summed into one line this often: a
/// full disk fails every batch, thousands a second.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// After a failed write-back, eviction pauses this long before it tries
/// again, doubling up to the most. A full disk refuses every batch at once:
/// without the pause the handler moved ~2000 batches a second out of the
/// region and back, and a run on a loaded machine crawled.
const RETRY_FIRST: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// A failed write-back keeps its pages resident (nothing is lost; the
/// region goes over its budget until the store takes writes again). The
/// first failure is logged at once, later ones summed per interval, and
/// eviction holds off for a growing pause (`RETRY_MAX` at most, so a store
/// that comes back is used again within a tenth of a second).
#[derive(Default)]
pub(crate) struct FailureLog {
    last_logged: Option<Instant>,
    batches_since: u64,
    pages_since: u64,
    backoff: Duration,
    retry_at: Option<Instant>,
}

impl FailureLog {
    /// Whether eviction should wait: a write-back failed moments ago.
    pub(crate) fn holding_off(&self) -> bool {
        self.retry_at.is_some_and(|at| Instant::now() < at)
    }

    /// A write-back succeeded: the next failure starts the pauses afresh.
    pub(crate) fn succeeded(&mut self) {
        (self.backoff, self.retry_at) = (Duration::ZERO, None);
    }

    pub(crate) fn note(&mut self, pages: usize, e: &StoreError) {
        self.backoff = (self.backoff * 2).clamp(RETRY_FIRST, RETRY_MAX);
        self.retry_at = Some(Instant::now() + self.backoff);
        self.batches_since += 1;
        self.pages_since += pages as u64;
        if self.last_logged.is_some_and(|t| t.elapsed() < FAILURE_LOG_INTERVAL) {
            return;
        }
        let (batches, pages) = (self.batches_since, self.pages_since);
        tracing::error!(
            "fault handler: write-back failed ({batches} batches, {pages} pages since the last report): {e}; the pages stay resident, over the budget, until the store takes writes"
        );
        (self.last_logged, self.batches_since, self.pages_since) = (Some(Instant::now()), 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_write_backs_pause_eviction_for_a_growing_bounded_while() {
        let mut log = FailureLog::default();
        assert!(!log.holding_off());
        let full = StoreError::NoSpace("disk full".into());
        log.note(8, &full);
        assert!(log.holding_off());
        assert_eq!(log.backoff, RETRY_FIRST);
        for _ in 0..20 {
            log.note(8, &full);
        }
        assert_eq!(log.backoff, RETRY_MAX, "doubling stops at the most");
        log.succeeded();
        assert!(!log.holding_off(), "a store that takes writes again is used at once");
        log.note(8, &full);
        assert_eq!(log.backoff, RETRY_FIRST);
        std::thread::sleep(RETRY_FIRST * 2);
        assert!(!log.holding_off());
    }
}
