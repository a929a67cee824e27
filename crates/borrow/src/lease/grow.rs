//! Leases as the region fills. A region borrowed from the cluster is cut
//! into segments: the first is leased when the region opens, each other one
//! when the first page is written to it. So a program asking for 32 GiB
//! and using 3 holds about 3 GiB of the cluster's memory, not 32, and a
//! cluster that cannot lend everything at once can still run it.
//!
//! The next segment is leased ahead: when writes first reach half of a
//! segment (`store::layer::watermark`), the lease thread is asked for the
//! next one without waiting for the answer, so the write-back that first
//! reaches it finds its lease there. The cost is at most one segment held
//! before it is written, and never before its predecessor is half full.
//!
//! Segment sizes start at `first` and double, up to `SEGMENT_BYTES_MAX`:
//! few leases for a big region (each lease is a slab and a connection),
//! small ones while a region is young. Offsets are fixed, so the preload
//! shim's arena, which allocates from the low end, fills segments in order.

use super::{Event, Grow};
use memlend_store::layer::on_demand::{OnDemand, Open};
use memlend_store::layer::watermark::{Hook, Watermark};
use memlend_store::{PageStore, StoreInfo, PAGE_SIZE};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// The first segment's size unless `MEMLEND_LEASE_FIRST` says otherwise.
pub const DEFAULT_FIRST_BYTES: u64 = 256 << 20;
/// The smallest first segment: the daemon's grant unit.
pub const FIRST_BYTES_MIN: u64 = 1 << 20;
/// The largest segment: a reclaim moves a whole lease before its deadline.
pub const SEGMENT_BYTES_MAX: u64 = 2 << 30;
/// How long a write waits for its segment's lease.
pub const GROW_WAIT: Duration = Duration::from_secs(3);
/// After a segment could not be leased, writes to it fail at once for this
/// long (the fault handler keeps those pages resident and tries again)
/// instead of asking the daemon again for every batch.
pub const GROW_RETRY: Duration = Duration::from_secs(1);

/// Segment sizes in pages for a region of `pages`: `first_pages`, then
/// each the double of the one before (the second equals the first), at
/// most `SEGMENT_BYTES_MAX`, the last what is left.
pub fn layout(pages: u64, first_pages: u64) -> Vec<u64> {
    let max_pages = SEGMENT_BYTES_MAX / PAGE_SIZE as u64;
    let mut sizes = Vec::new();
    let (mut left, mut next) = (pages, first_pages.clamp(1, max_pages));
    while left > 0 {
        let size = next.min(left);
        sizes.push(size);
        left -= size;
        if sizes.len() > 1 {
            next = (next * 2).min(max_pages);
        }
    }
    sizes
}

/// The first segment's size in bytes: `MEMLEND_LEASE_FIRST` (a size such
/// as `64M`), else the default; rounded up to the grant unit.
pub fn first_bytes() -> anyhow::Result<u64> {
    let Some(text) = std::env::var_os(crate::env::LEASE_FIRST) else {
        return Ok(DEFAULT_FIRST_BYTES);
    };
    let text = text.to_string_lossy();
    let bytes = memlend_node::size::parse_size(&text)
        .map_err(|e| anyhow::anyhow!("{}={text}: {e}", crate::env::LEASE_FIRST))?;
    Ok(bytes.max(FIRST_BYTES_MIN).div_ceil(FIRST_BYTES_MIN) * FIRST_BYTES_MIN)
}

/// Where a segment's `Grow` goes, as one of the lease thread's events.
pub type Asks = SyncSender<Event>;

/// A segment not yet leased: an `on_demand` store (it reads as zeros until
/// written) whose `open` asks the region's lease thread for the segment's
/// lease and waits for it. The store layer knows nothing of leases; the
/// ask travels as a closure.
pub fn unleased_segment(segment: usize, pages: u64, like: StoreInfo, asks: Asks) -> OnDemand {
    let open: Open = Box::new(move || ask(segment, pages, &asks));
    OnDemand::new(pages, like, format!("segment {segment}"), GROW_RETRY, open)
}

/// Segment `segment` of `pages`, with a watermark at its half that asks the
/// lease thread for segment `segment + 1` (of `next_pages`) ahead of its
/// first write. The ask is queued and not waited for; if the queue is full
/// it is dropped, and the next segment is leased at its first write.
pub fn leasing_ahead(
    store: Arc<dyn PageStore>,
    pages: u64,
    segment: usize,
    next_pages: u64,
    asks: Asks,
) -> Watermark {
    let hook: Hook = Box::new(move || {
        // Nobody waits for this answer; the lease thread keeps the store
        // in its segment table and hands it to the segment's first write.
        let (reply, _dropped) = mpsc::sync_channel(1);
        let grow = Grow { segment: segment + 1, pages: next_pages, reply };
        if asks.try_send(Event::Grow(grow)).is_err() {
            tracing::debug!(segment = segment + 1, "lease ahead not queued");
        }
    });
    Watermark::new(store, pages / 2, hook)
}

fn ask(segment: usize, pages: u64, asks: &Asks) -> Result<Arc<dyn PageStore>, String> {
    let (reply, answer) = mpsc::sync_channel(1);
    let grow = Grow { segment, pages, reply };
    let gone = || "the region's lease thread has stopped".to_string();
    asks.send(Event::Grow(grow)).map_err(|_| gone())?;
    // The lease thread may be moving a reclaimed lease: wait a little
    // longer than it waits for the cluster.
    match answer.recv_timeout(GROW_WAIT + Duration::from_secs(2)) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => Err("no lease in time".into()),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
    }
}

#[cfg(test)]
#[path = "grow_tests.rs"]
mod tests;
