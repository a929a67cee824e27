//! Leases as the region fills. A region borrowed from the cluster is cut
//! into segments: the first is leased when the region opens, each other one
//! when the first page is written to it. So a program asking for 32 GiB
//! and using 3 holds about 3 GiB of the cluster's memory, not 32, and a
//! cluster that cannot lend everything at once can still run it.
//!
//! Segment sizes start at `first` and double, up to `MAX_SEGMENT_BYTES`:
//! few leases for a big region (each lease is a slab and a connection),
//! small ones while a region is young. Offsets are fixed, so the preload
//! shim's arena, which allocates from the low end, fills segments in order.

use memlend_store::{PageStore, ReadOp, StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use parking_lot::{Mutex, RwLock};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first segment's size unless `MEMLEND_LEASE_FIRST` says otherwise.
pub const DEFAULT_FIRST_BYTES: u64 = 256 << 20;
/// The smallest first segment: the daemon's grant unit.
pub const MIN_FIRST_BYTES: u64 = 1 << 20;
/// The largest segment: a reclaim moves a whole lease before its deadline.
pub const MAX_SEGMENT_BYTES: u64 = 2 << 30;
/// How long a write waits for its segment's lease.
pub const GROW_WAIT: Duration = Duration::from_secs(3);
/// After a segment could not be leased, writes to it fail at once for this
/// long (the fault handler keeps those pages resident and tries again)
/// instead of asking the daemon again for every batch.
pub const GROW_RETRY: Duration = Duration::from_secs(1);

/// Segment sizes in pages for a region of `pages`: `first_pages`, then
/// each the double of the one before (the second equals the first), at
/// most `MAX_SEGMENT_BYTES`, the last what is left.
pub fn layout(pages: u64, first_pages: u64) -> Vec<u64> {
    let max_pages = MAX_SEGMENT_BYTES / PAGE_SIZE as u64;
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
    Ok(bytes.max(MIN_FIRST_BYTES).div_ceil(MIN_FIRST_BYTES) * MIN_FIRST_BYTES)
}

/// A segment's request for its lease, answered by the region's lease
/// thread with the store to write to, or why there is none.
pub struct Grow {
    pub segment: usize,
    pub pages: u64,
    pub reply: SyncSender<Result<Arc<dyn PageStore>, String>>,
}

/// Where a segment's `Grow` goes, as one of the lease thread's events.
pub type Asks = SyncSender<crate::reclaim::Event>;

/// A segment not yet leased: it reads as zeros (nothing was written) and
/// its first write asks for the lease and waits for it.
pub struct Lazy {
    segment: usize,
    pages: u64,
    /// What the segment will be: the info of the region's first lease.
    like: StoreInfo,
    inner: RwLock<Option<Arc<dyn PageStore>>>,
    /// One ask at a time; holds when the last ask was refused.
    asking: Mutex<Option<Instant>>,
    asks: Asks,
}

impl Lazy {
    pub fn new(segment: usize, pages: u64, like: StoreInfo, asks: Asks) -> Lazy {
        let (inner, asking) = (RwLock::new(None), Mutex::new(None));
        Lazy { segment, pages, like, inner, asking, asks }
    }

    fn current(&self) -> Option<Arc<dyn PageStore>> {
        self.inner.read().clone()
    }

    /// The segment's store, leased now if it is not yet.
    fn leased(&self) -> StoreResult<Arc<dyn PageStore>> {
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let mut refused = self.asking.lock();
        if let Some(s) = self.current() {
            return Ok(s);
        }
        if refused.is_some_and(|until| Instant::now() < until) {
            return Err(StoreError::NoSpace(format!(
                "segment {} of the region has no lease yet (asked less than {} s ago)",
                self.segment,
                GROW_RETRY.as_secs()
            )));
        }
        match self.ask() {
            Ok(s) => {
                *self.inner.write() = Some(Arc::clone(&s));
                Ok(s)
            }
            Err(why) => {
                *refused = Some(Instant::now() + GROW_RETRY);
                Err(StoreError::NoSpace(format!("segment {}: {why}", self.segment)))
            }
        }
    }

    fn ask(&self) -> Result<Arc<dyn PageStore>, String> {
        let (reply, answer) = mpsc::sync_channel(1);
        let grow = Grow { segment: self.segment, pages: self.pages, reply };
        let gone = || "the region's lease thread has stopped".to_string();
        self.asks.send(crate::reclaim::Event::Grow(grow)).map_err(|_| gone())?;
        // The lease thread may be moving a reclaimed lease: wait a little
        // longer than it waits for the cluster.
        match answer.recv_timeout(GROW_WAIT + Duration::from_secs(2)) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err("no lease in time".into()),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }
}

impl PageStore for Lazy {
    /// Always this segment's size, so the offsets of the segments after it
    /// never change, whatever the leases hold.
    fn info(&self) -> StoreInfo {
        let (pages, segment) = (self.pages, self.segment);
        match self.current() {
            Some(s) => StoreInfo { pages, ..s.info() },
            None => StoreInfo { pages, name: format!("unleased({segment})"), ..self.like.clone() },
        }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        match self.current() {
            Some(s) => s.read(ops),
            None => {
                for op in ops.iter_mut() {
                    memlend_store::check_run(self.pages, op.page, op.buf.len())?;
                    op.buf.fill(0);
                }
                Ok(())
            }
        }
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            memlend_store::check_run(self.pages, op.page, op.data.len())?;
        }
        self.leased()?.write(ops)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        match self.current() {
            Some(s) => s.discard(page, count),
            None => memlend_store::check_range(self.pages, page, count),
        }
    }

    fn flush(&self) -> StoreResult<()> {
        self.current().map_or(Ok(()), |s| s.flush())
    }
}

#[cfg(test)]
#[path = "grow_tests.rs"]
mod tests;
