//! `stats`: counts and times every operation of the store it wraps.
//!
//! Per kind of operation (read, write, discard, flush) it keeps the number of
//! operations, pages and errors, and a histogram of latencies in log2
//! buckets. Everything is a relaxed atomic add, so the hot path takes no lock
//! and the cost is two clock reads and three adds per operation (not per
//! page). Each kind sits on its own cache lines, so readers and writers on
//! different cores do not bounce one line between them.
//!
//! A snapshot reads counters one by one while operations go on: each counter
//! is exact, but two counters may disagree by the operations in flight.

use crate::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Bucket `b` counts latencies in `[2^b, 2^(b+1))` ns (bucket 0 also takes
/// 0 ns); the last bucket takes everything from 2^39 ns (about 9 minutes) up.
const BUCKETS: usize = 40;

/// Wraps `S` and counts and times everything that passes through it; read
/// the totals with [`Stats::snapshot`].
pub struct Stats<S> {
    inner: S,
    read: OpCounters,
    write: OpCounters,
    discard: OpCounters,
    flush: OpCounters,
}

#[repr(align(128))]
struct OpCounters {
    ops: AtomicU64,
    pages: AtomicU64,
    errors: AtomicU64,
    latency_ns_log2: [AtomicU64; BUCKETS],
}

/// Totals for one kind of operation since the layer was made.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpSnapshot {
    pub ops: u64,
    /// Pages moved (read, written or discarded) by operations that succeeded.
    pub pages: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Latency quantiles over all operations, interpolated inside a log2
    /// bucket: good to within a factor of two, usually much better.
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StatsSnapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub discard: OpSnapshot,
    pub flush: OpSnapshot,
}

impl<S: PageStore> Stats<S> {
    pub fn new(inner: S) -> Self {
        Stats {
            inner,
            read: OpCounters::new(),
            write: OpCounters::new(),
            discard: OpCounters::new(),
            flush: OpCounters::new(),
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            discard: self.discard.snapshot(),
            flush: self.flush.snapshot(),
        }
    }
}

impl<S: PageStore> PageStore for Stats<S> {
    fn info(&self) -> StoreInfo {
        let inner = self.inner.info();
        StoreInfo { name: format!("stats({})", inner.name), ..inner }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        let pages = ops.iter().map(|op| (op.buf.len() / PAGE_SIZE) as u64).sum();
        let start = Instant::now();
        let result = self.inner.read(ops);
        self.read.record(start, pages, &result);
        result
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let pages = ops.iter().map(|op| (op.data.len() / PAGE_SIZE) as u64).sum();
        let start = Instant::now();
        let result = self.inner.write(ops);
        self.write.record(start, pages, &result);
        result
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        let start = Instant::now();
        let result = self.inner.discard(page, count);
        self.discard.record(start, count, &result);
        result
    }

    fn flush(&self) -> StoreResult<()> {
        let start = Instant::now();
        let result = self.inner.flush();
        self.flush.record(start, 0, &result);
        result
    }

    // Pages and bytes are the inner store's, one to one.
    fn allocation(
        &self,
        page: u64,
        count: u64,
        out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        self.inner.allocation(page, count, out)
    }
}

impl OpCounters {
    fn new() -> Self {
        OpCounters {
            ops: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency_ns_log2: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn record(&self, start: Instant, pages: u64, result: &StoreResult<()>) {
        let latency_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.ops.fetch_add(1, Relaxed);
        match result {
            Ok(()) => self.pages.fetch_add(pages, Relaxed),
            Err(_) => self.errors.fetch_add(1, Relaxed),
        };
        self.latency_ns_log2[bucket_of(latency_ns)].fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> OpSnapshot {
        let counts: [u64; BUCKETS] = std::array::from_fn(|b| self.latency_ns_log2[b].load(Relaxed));
        let pages = self.pages.load(Relaxed);
        OpSnapshot {
            ops: self.ops.load(Relaxed),
            pages,
            bytes: pages * PAGE_SIZE as u64,
            errors: self.errors.load(Relaxed),
            latency_us_p50: quantile_ns(&counts, 0.50) / 1000.0,
            latency_us_p99: quantile_ns(&counts, 0.99) / 1000.0,
        }
    }
}

fn bucket_of(latency_ns: u64) -> usize {
    (latency_ns.max(1).ilog2() as usize).min(BUCKETS - 1)
}

/// The `q` quantile of a log2 histogram, interpolated linearly by rank inside
/// the bucket it falls in. 0 for an empty histogram.
fn quantile_ns(counts: &[u64; BUCKETS], q: f64) -> f64 {
    assert!((0.0..=1.0).contains(&q));
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    // The rank of the wanted sample, 1-based: the p50 of 1..=4 is the 2nd.
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut below = 0;
    for (b, &count) in counts.iter().enumerate() {
        if below + count >= rank {
            let (low, high) =
                if b == 0 { (0.0, 2.0) } else { ((1u64 << b) as f64, (2u64 << b) as f64) };
            let frac = (rank - below) as f64 / count as f64;
            return low + (high - low) * frac;
        }
        below += count;
    }
    unreachable!("rank {rank} beyond {total} samples");
}

/// What this layer adds, in a named stack's help and errors.
pub(crate) const ADDS: &str = "every operation counted and timed";

/// This layer in a named stack (`registry.rs`), reporting per kind of
/// operation its count, pages and latency.
pub(crate) fn named(
    base: std::sync::Arc<dyn PageStore>,
    reports: &mut Vec<super::report::Report>,
) -> StoreResult<std::sync::Arc<dyn PageStore>> {
    let layer = std::sync::Arc::new(Stats::new(base));
    let seen = std::sync::Arc::clone(&layer);
    reports.push(Box::new(move || {
        let s = seen.snapshot();
        let op = |name: &str, o: &OpSnapshot| {
            format!(
                "{name} {} ops {} pages p50 {:.1} us p99 {:.1} us",
                o.ops, o.pages, o.latency_us_p50, o.latency_us_p99
            )
        };
        format!(
            "stats: {}; {}; {}",
            op("read", &s.read),
            op("write", &s.write),
            op("discard", &s.discard)
        )
    }));
    Ok(layer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};
    use crate::StoreError;

    #[test]
    fn buckets_are_log2_of_nanoseconds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 1);
        assert_eq!(bucket_of(1023), 9);
        assert_eq!(bucket_of(1024), 10);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_land_in_the_right_bucket() {
        let mut counts = [0u64; BUCKETS];
        assert_eq!(quantile_ns(&counts, 0.5), 0.0);
        counts[10] = 99; // 99 samples in [1024, 2048) ns
        counts[20] = 1; // one in [1, 2) ms
        let p50 = quantile_ns(&counts, 0.5);
        assert!((1024.0..2048.0).contains(&p50), "{p50}");
        assert_eq!(quantile_ns(&counts, 0.99), 2048.0);
        let p100 = quantile_ns(&counts, 1.0);
        assert!(((1 << 20) as f64..=(2 << 20) as f64).contains(&p100), "{p100}");
    }

    #[test]
    fn counts_ops_pages_bytes_and_errors_and_wraps_the_name() {
        let s = Stats::new(RamStore::new(16, RamOptions::default()).unwrap());
        assert_eq!(s.info().name, "stats(ram)");
        let data = vec![1u8; 2 * PAGE_SIZE];
        s.write(&[WriteOp { page: 0, data: &data }, WriteOp { page: 4, data: &data }]).unwrap();
        let mut buf = vec![0u8; PAGE_SIZE];
        s.read(&mut [ReadOp { page: 1, buf: &mut buf }]).unwrap();
        let err = s.read(&mut [ReadOp { page: 16, buf: &mut buf }]);
        assert!(matches!(err, Err(StoreError::OutOfRange { .. })));
        s.discard(0, 3).unwrap();
        s.flush().unwrap();
        let snap = s.snapshot();
        assert_eq!(
            (snap.write.ops, snap.write.pages, snap.write.bytes),
            (1, 4, 4 * PAGE_SIZE as u64)
        );
        assert_eq!((snap.read.ops, snap.read.pages, snap.read.errors), (2, 1, 1));
        assert_eq!((snap.discard.ops, snap.discard.pages, snap.flush.ops), (1, 3, 1));
        assert!(
            snap.read.latency_us_p50 > 0.0 && snap.read.latency_us_p99 >= snap.read.latency_us_p50
        );
    }
}
