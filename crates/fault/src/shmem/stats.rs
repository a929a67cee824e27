//! What the shared-memory server has done, read by whoever runs it (the
//! run summary, the budget that follows `--mem`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default, Debug)]
pub struct SharedStats {
    /// Segments served now.
    pub segments: AtomicU64,
    /// Segments ever offered, and their bytes.
    pub segments_taken: AtomicU64,
    pub segment_bytes: AtomicU64,
    /// Segments refused (and why was logged).
    pub segments_refused: AtomicU64,
    /// Processes that map a segment now (one per segment each).
    pub processes: AtomicU64,
    /// Pages in the memfds now that the server placed.
    pub resident_pages: AtomicU64,
    /// Pages in the stores now, not in the memfds.
    pub far_pages: AtomicU64,
    pub evicted_pages: AtomicU64,
    pub store_reads: AtomicU64,
    pub zero_fills: AtomicU64,
    pub pages_poisoned: AtomicU64,
    /// Far pages brought back into a memfd as the server let go of it.
    pub brought_home: AtomicU64,
}

impl SharedStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Relaxed)
    }
}
