//! `erasure`: pages spread over k data stores with m parity stores (Reed-
//! Solomon, `reed-solomon-simd`), so any m stores can fail with nothing
//! lost, for (k+m)/k of the memory instead of a mirror's 2x.
//!
//! Layout. Logical page p is in stripe s = p / k, on data leg p % k, at leg
//! page s. Parity leg j holds parity shard j of stripe s at leg page s.
//!
//! Writes update whole stripes: under the stripes' locks, their other data
//! pages are read (pages never written are zero and are not read), the m
//! parity pages computed and written with the new data. A batch does this
//! for all its stripes at once, one request a leg (`batch.rs`), so a run of
//! whole stripes reads nothing and costs (k+m)/k pages written a page. A leg whose read or write fails is
//! dropped; a stripe stays decodable as long as at most m legs are. So a
//! leg is never dropped beyond that: an error there may be a slow leg (a
//! retransmission past the store's timeout), not a dead one, and dropping
//! it would leave nothing decodable though every leg still holds its pages.
//! The operation fails instead (the caller retries; a failed write-back
//! keeps its pages), the next one tries the leg again, and
//! `kept_leg_errors` counts it.
//!
//! Reads go to the page's data leg and are checked against a CRC32C kept
//! here (4 B/page). A page whose leg failed, or that fails its sum, is
//! decoded from k other shards of its stripe (degraded read), under the
//! stripe's shared lock so no write is half done meanwhile.
//!
//! Rebuild. With a spare maker, a dropped leg is replaced in the background
//! (`rebuild.rs`): the spare takes the leg's slot as write-only, so new
//! stripe writes reach it; a copier computes the slot's shard of every
//! written stripe under that stripe's lock; then the leg is readable again.

mod batch;
mod rebuild;
mod refill;
mod stripe;

use super::mirror::SpareFn;
use super::table::{Bitmap, Sums};
use crate::page_locks::{LockSet, PageLocks};
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo};
use crate::{StoreResult, WriteOp, PAGE_SIZE};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

/// Most legs (data + parity).
pub const LEGS_MAX: usize = 16;

const HEALTHY: u8 = 0;
/// Being filled by the rebuilder: written, never read.
const REBUILDING: u8 = 1;
const FAILED: u8 = 2;

/// One slot of the code: its store changes when a spare replaces it.
struct Leg {
    store: RwLock<Arc<dyn PageStore>>,
    label: RwLock<String>,
    state: AtomicU8,
}

impl Leg {
    fn store(&self) -> Arc<dyn PageStore> {
        Arc::clone(&self.store.read())
    }

    fn readable(&self) -> bool {
        self.state.load(Relaxed) == HEALTHY
    }

    fn writable(&self) -> bool {
        self.state.load(Relaxed) != FAILED
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErasureStats {
    pub data_legs: usize,
    pub parity_legs: usize,
    pub healthy_legs: usize,
    /// Legs dropped after an error.
    pub leg_failures: u64,
    /// Pages rebuilt from other shards because their leg failed or lied.
    pub degraded_reads: u64,
    /// Legs rebuilt on a spare.
    pub rebuilds: u64,
    /// Shards written to spares by the rebuilder.
    pub pages_rebuilt: u64,
    /// Pages a leg returned with the wrong contents.
    pub bad_copies: u64,
    /// Pages no combination of shards could rebuild.
    pub lost_pages: u64,
    /// Errors on a leg kept because dropping it would have left more than
    /// m legs unreadable; each failed its operation.
    pub kept_leg_errors: u64,
}

#[derive(Default)]
struct Counters {
    leg_failures: AtomicU64,
    kept_leg_errors: AtomicU64,
    degraded_reads: AtomicU64,
    rebuilds: AtomicU64,
    pages_rebuilt: AtomicU64,
    bad_copies: AtomicU64,
    lost_pages: AtomicU64,
}

/// An erasure-coded store; the rebuilder, if any, stops when it drops.
pub struct Erasure {
    inner: Arc<Coded>,
    rebuilder: Option<std::thread::JoinHandle<()>>,
}

/// What the store and its rebuilder share.
struct Coded {
    legs: Box<[Leg]>,
    k: usize,
    m: usize,
    pages: u64,
    sums: Sums,
    written: Bitmap,
    /// Keyed by stripe number.
    locks: PageLocks,
    counters: Counters,
    spare: Option<SpareFn>,
    /// Labels of legs that failed, so spares go elsewhere.
    failed_labels: Mutex<Vec<String>>,
    stop: AtomicBool,
    work: (Mutex<bool>, Condvar),
}

impl Erasure {
    /// `data` legs then `parity` legs, each (store, label), fresh (reading
    /// zeroes) and holding at least `pages / k` rounded up.
    pub fn new(
        data: Vec<(Arc<dyn PageStore>, String)>,
        parity: Vec<(Arc<dyn PageStore>, String)>,
        pages: u64,
        spare: Option<SpareFn>,
    ) -> StoreResult<Erasure> {
        let (k, m) = (data.len(), parity.len());
        if k == 0 || m == 0 || k + m > LEGS_MAX {
            let why =
                format!("erasure coding needs k >= 1, m >= 1, k + m <= {LEGS_MAX}; got {k}+{m}");
            return Err(StoreError::Unavailable(why));
        }
        let per_leg = pages.div_ceil(k as u64);
        if let Some((s, l)) = data.iter().chain(&parity).find(|(s, _)| s.info().pages < per_leg) {
            let has = s.info().pages;
            return Err(StoreError::NoSpace(format!("leg {l} holds {has} pages, not {per_leg}")));
        }
        let legs = data.into_iter().chain(parity).map(|(store, label)| Leg {
            store: RwLock::new(store),
            label: RwLock::new(label),
            state: AtomicU8::new(HEALTHY),
        });
        let has_spare = spare.is_some();
        let inner = Arc::new(Coded {
            legs: legs.collect(),
            k,
            m,
            pages,
            sums: Sums::new(pages)?,
            written: Bitmap::new(pages, "written bits")?,
            locks: PageLocks::new(),
            counters: Counters::default(),
            spare,
            failed_labels: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            work: (Mutex::new(false), Condvar::new()),
        });
        let rebuilder = has_spare.then(|| rebuild::spawn(Arc::clone(&inner))).transpose()?;
        Ok(Erasure { inner, rebuilder })
    }

    pub fn stats(&self) -> ErasureStats {
        self.inner.stats()
    }
}

impl Drop for Erasure {
    fn drop(&mut self) {
        self.inner.stop.store(true, Relaxed);
        self.inner.wake();
        if let Some(t) = self.rebuilder.take() {
            let _ = t.join();
        }
    }
}

impl Coded {
    fn wake(&self) {
        *self.work.0.lock() = true;
        self.work.1.notify_all();
    }

    fn stats(&self) -> ErasureStats {
        let c = &self.counters;
        ErasureStats {
            data_legs: self.k,
            parity_legs: self.m,
            healthy_legs: self.legs.iter().filter(|l| l.readable()).count(),
            leg_failures: c.leg_failures.load(Relaxed),
            degraded_reads: c.degraded_reads.load(Relaxed),
            rebuilds: c.rebuilds.load(Relaxed),
            pages_rebuilt: c.pages_rebuilt.load(Relaxed),
            bad_copies: c.bad_copies.load(Relaxed),
            lost_pages: c.lost_pages.load(Relaxed),
            kept_leg_errors: c.kept_leg_errors.load(Relaxed),
        }
    }

    /// Drop leg `leg` after error `e` from `used`, its store when the
    /// operation began, unless it is readable and m legs are unreadable
    /// already (then it is kept: see the module comment). Returns whether
    /// the shard is unusable for the operation (dropped now or before).
    ///
    /// A store the slot no longer holds is not the leg's fault: a read sent
    /// to a donor that died can fail after a spare took the slot, and
    /// charging that error to the slot dropped the fresh spare too (a 2+1
    /// code then ran with two legs failed; seen in the chaos test).
    fn leg_failed(
        &self,
        leg: usize,
        used: &Arc<dyn PageStore>,
        e: &StoreError,
        what: &str,
    ) -> bool {
        let l = &self.legs[leg];
        let same = |a: &Arc<dyn PageStore>| {
            std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(used).cast::<()>())
        };
        if !same(&l.store.read()) {
            return true;
        }
        // Concurrent failures may both pass this check and drop m + 1 legs;
        // that is the behaviour before the check, and needs two legs
        // failing within the same instant.
        if l.readable() && self.failed_legs() >= self.m {
            self.counters.kept_leg_errors.fetch_add(1, Relaxed);
            let label = l.label.read().clone();
            tracing::warn!(leg = %label, error = %e, "{what} failed; shard kept, {} already unreadable", self.m);
            return false;
        }
        if l.state.swap(FAILED, Relaxed) != FAILED {
            let label = l.label.read().clone();
            self.counters.leg_failures.fetch_add(1, Relaxed);
            tracing::warn!(leg = %label, error = %e, "{what} failed: shard dropped");
            self.failed_labels.lock().push(label);
            self.wake();
        }
        true
    }

    /// Legs that cannot be read: failed, or still being rebuilt.
    fn failed_legs(&self) -> usize {
        self.legs.iter().filter(|l| !l.readable()).count()
    }

    fn too_many_failed(&self) -> Option<StoreError> {
        let failed = self.failed_legs();
        (failed > self.m).then(|| {
            StoreError::Unavailable(format!(
                "{failed} of {} legs failed; at most {} may",
                self.k + self.m,
                self.m
            ))
        })
    }
}

impl PageStore for Erasure {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.inner.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.inner.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        Ok(())
    }
}

impl Coded {
    fn info(&self) -> StoreInfo {
        let names: Vec<String> = self.legs.iter().map(|l| l.store().info().name).collect();
        let caps = Caps { durable: false, discard_frees: true, fast: false, checked: true };
        let name = format!("erasure{}+{}({})", self.k, self.m, names.join(", "));
        StoreInfo { pages: self.pages, caps, name }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        for op in ops.iter_mut() {
            self.read_run(op.page, op.buf)?;
        }
        Ok(())
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let mut new: BTreeMap<u64, BTreeMap<usize, &[u8]>> = BTreeMap::new();
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
            for (i, data) in op.data.chunks_exact(PAGE_SIZE).enumerate() {
                let p = op.page + i as u64;
                new.entry(p / self.k as u64)
                    .or_default()
                    .insert((p % self.k as u64) as usize, data);
            }
        }
        let updates: Vec<batch::Update<'_>> = new.into_iter().collect();
        self.write_stripes(&updates)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        let zero = [0u8; PAGE_SIZE];
        let k = self.k as u64;
        let end = page + count;
        let mut stripe = page / k;
        // A batch of stripes at a time: a long discard holds no table of
        // every stripe it covers.
        while stripe * k < end {
            let mut updates = Vec::new();
            while stripe * k < end && updates.len() < 256 {
                let (first, last) = ((stripe * k).max(page), ((stripe + 1) * k).min(end));
                let pages: BTreeMap<usize, &[u8]> =
                    (first..last).map(|p| ((p % k) as usize, &zero[..])).collect();
                updates.push((stripe, pages));
                stripe += 1;
            }
            self.write_stripes(&updates)?;
        }
        Ok(())
    }

    fn stripe_lock(&self, stripe: u64) -> LockSet {
        LockSet::of_run(stripe, 1)
    }
}

#[cfg(test)]
mod tests;
