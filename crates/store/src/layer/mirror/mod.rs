//! `mirror`: every page on two or more stores ("legs"), so that a donor that
//! dies, hangs or returns a bad page loses nothing.
//!
//! - **Writes** go to every live leg at once; a leg whose write fails is
//!   dropped (never read again) and the write succeeds if a healthy leg took
//!   it. Writers own the pages' stripe locks across the fan-out, so two
//!   racing writes of a page land in the same order on every leg.
//! - **Reads** go to one healthy leg (the first, or one chosen by page when
//!   `spread_reads`); if it fails, the next. Every page read is checked
//!   against a CRC32C kept here (4 B/page), so a leg that returns wrong bytes
//!   is caught: the page is read from another leg, the bad copy is counted,
//!   logged and rewritten from the good one. When every leg checks its own
//!   pages (`Caps::checked`: encrypted donor slabs), the mirror keeps no
//!   sums: a leg reports a bad page as `Corrupt` and zeroes it, and the
//!   zeroed pages of such a read are read again, then from another leg.
//!   A spare that does not check its pages gets a `checksum` of its own.
//! - **Rebuild.** A dropped leg is replaced in the background: a spare store
//!   comes from the `SpareFn` (another donor, or local SSD), joins as a
//!   write-only leg, and a copier fills it with every page ever written (a
//!   bitmap, 1 bit/page, so a sparse region copies only what it holds). Once
//!   full it becomes readable. The copier and writers exclude each other
//!   per page with the stripe locks, and a barrier (all stripes, once) after
//!   the spare joins makes sure no writer still holds a list of legs that
//!   lacks it. See `rebuild.rs`.
//!
//! Failure detection is the legs' own: a remote leg's I/O timeout bounds how
//! long a dead or stopped donor can stall an operation (about a second when
//! placed for redundancy), after which the mirror fails over.

mod fan;
mod legs;
mod rebuild;
mod verify;

use super::table::{Bitmap, Sums};
use crate::page_locks::{LockSet, PageLocks};
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo};
use crate::{StoreResult, WriteOp, PAGE_SIZE};
use legs::{is_caller_error, Leg};
use parking_lot::{Condvar, Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Most copies of a page.
pub const LEGS_MAX: usize = 4;
/// Pages read ahead of a chunk choice when spreading reads: a sequential run
/// stays on one leg for this many pages.
const SPREAD_CHUNK_PAGES: u64 = 64;

/// What the rebuilder asks for: a store of at least `pages` pages that is
/// not at any of the `avoid` labels (where the live and the failed legs are).
pub struct SpareRequest<'a> {
    pub pages: u64,
    pub avoid: &'a [String],
}

/// Makes a spare leg: the store and its label.
pub type SpareFn =
    Box<dyn Fn(&SpareRequest) -> StoreResult<(Arc<dyn PageStore>, String)> + Send + Sync>;

#[derive(Clone, Copy, Debug)]
pub struct MirrorOptions {
    /// Start each read at a leg chosen by page, spreading load over legs of
    /// equal speed. Off: legs in the order given (put the fast one first,
    /// e.g. a donor before its SSD backup).
    pub spread_reads: bool,
    /// Wait this long before asking again for a spare that was not there.
    pub spare_retry: Duration,
}

impl Default for MirrorOptions {
    fn default() -> MirrorOptions {
        MirrorOptions { spread_reads: false, spare_retry: Duration::from_secs(2) }
    }
}

/// What the mirror has done since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MirrorStats {
    pub legs: usize,
    pub healthy_legs: usize,
    /// Legs dropped after an error.
    pub leg_failures: u64,
    /// Errors of the last healthy leg, which is kept (not dropped).
    pub last_leg_errors: u64,
    /// Pages a leg returned with the wrong contents.
    pub bad_copies: u64,
    /// Bad copies rewritten from a good one.
    pub repaired_pages: u64,
    /// Pages for which no leg had a good copy.
    pub lost_pages: u64,
    /// Spare legs filled and made readable.
    pub rebuilds: u64,
    pub pages_rebuilt: u64,
    pub rebuilding: bool,
}

#[derive(Default)]
struct Counters {
    leg_failures: AtomicU64,
    last_leg_errors: AtomicU64,
    bad_copies: AtomicU64,
    repaired_pages: AtomicU64,
    lost_pages: AtomicU64,
    rebuilds: AtomicU64,
    pages_rebuilt: AtomicU64,
    rebuilding: AtomicBool,
}

/// What the rebuilder waits for.
#[derive(Default)]
struct Signal {
    stop: bool,
    work: bool,
}

struct Shared {
    /// Replaced whole (copy on write) when a spare joins; operations take a
    /// snapshot, after their stripe locks when they hold any.
    legs: RwLock<Arc<[Arc<Leg>]>>,
    /// Labels of every leg that ever failed, so spares go elsewhere.
    failed_labels: Mutex<Vec<String>>,
    pages: u64,
    /// None when every leg checks its own pages.
    sums: Option<Sums>,
    written: Bitmap,
    locks: PageLocks,
    counters: Counters,
    opts: MirrorOptions,
    spare: Option<SpareFn>,
    signal: Mutex<Signal>,
    wake: Condvar,
}

pub struct Mirror {
    shared: Arc<Shared>,
    rebuilder: Option<std::thread::JoinHandle<()>>,
}

impl Mirror {
    /// Mirror `pages` pages over `legs` (store, label), all fresh (reading
    /// as zeroes) and at least `pages` long. With `spare`, a failed leg is
    /// replaced by a background thread.
    pub fn new(
        legs: Vec<(Arc<dyn PageStore>, String)>,
        pages: u64,
        opts: MirrorOptions,
        spare: Option<SpareFn>,
    ) -> StoreResult<Mirror> {
        if !(2..=LEGS_MAX).contains(&legs.len()) {
            let n = legs.len();
            return Err(StoreError::Unavailable(format!(
                "a mirror needs 2..={LEGS_MAX} legs, not {n}"
            )));
        }
        if let Some((s, _)) = legs.iter().find(|(s, _)| s.info().pages < pages) {
            let has = s.info().pages;
            return Err(StoreError::NoSpace(format!("a leg holds {has} pages, not {pages}")));
        }
        let checked = legs.iter().all(|(s, _)| s.info().caps.checked);
        let sums = if checked { None } else { Some(Sums::new(pages)?) };
        let legs: Vec<Arc<Leg>> = legs.into_iter().map(|(s, l)| Leg::healthy(s, l)).collect();
        let has_spare = spare.is_some();
        let shared = Arc::new(Shared {
            legs: RwLock::new(legs.into()),
            failed_labels: Mutex::new(Vec::new()),
            pages,
            sums,
            written: Bitmap::new(pages, "written bits")?,
            locks: PageLocks::new(),
            counters: Counters::default(),
            opts,
            spare,
            signal: Mutex::new(Signal::default()),
            wake: Condvar::new(),
        });
        let rebuilder = has_spare.then(|| rebuild::spawn(Arc::clone(&shared))).transpose()?;
        Ok(Mirror { shared, rebuilder })
    }

    pub fn stats(&self) -> MirrorStats {
        let c = &self.shared.counters;
        let legs = self.shared.snapshot();
        MirrorStats {
            legs: legs.len(),
            healthy_legs: legs.iter().filter(|l| l.is_healthy()).count(),
            leg_failures: c.leg_failures.load(Relaxed),
            last_leg_errors: c.last_leg_errors.load(Relaxed),
            bad_copies: c.bad_copies.load(Relaxed),
            repaired_pages: c.repaired_pages.load(Relaxed),
            lost_pages: c.lost_pages.load(Relaxed),
            rebuilds: c.rebuilds.load(Relaxed),
            pages_rebuilt: c.pages_rebuilt.load(Relaxed),
            rebuilding: c.rebuilding.load(Relaxed),
        }
    }

    /// Each leg's label and state ("healthy", "rebuilding", "failed").
    pub fn legs(&self) -> Vec<(String, &'static str)> {
        self.shared.snapshot().iter().map(|l| (l.label.clone(), l.state_name())).collect()
    }

    /// Bytes of per-page metadata (sums and written bits).
    pub fn metadata_bytes(&self) -> usize {
        let sums = self.shared.sums.as_ref().map_or(0, Sums::bytes);
        sums + (self.shared.written.words() * 8) as usize
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.shared.signal.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.rebuilder.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn snapshot(&self) -> Arc<[Arc<Leg>]> {
        Arc::clone(&self.legs.read())
    }

    /// Drop a leg after `e`; the first caller to see it logs, counts and
    /// wakes the rebuilder. Never the last healthy leg: its error may be a
    /// slow link rather than a dead donor (a retransmission past the leg
    /// timeout), and dropping it would leave no copy to read although the
    /// donor still holds every page. That operation fails; the next tries
    /// the leg again.
    fn leg_failed(&self, leg: &Leg, e: &StoreError, what: &str) {
        // Held across the check and the drop, so that two legs failing at
        // once cannot each count on the other as the healthy one left.
        let mut failed = self.failed_labels.lock();
        let legs = self.snapshot();
        let others = legs.iter().any(|l| !std::ptr::eq(&**l, leg) && l.is_healthy());
        if leg.is_healthy() && !others {
            self.counters.last_leg_errors.fetch_add(1, Relaxed);
            tracing::warn!(leg = %leg.label, error = %e, "{what} failed on the last healthy copy; kept");
            return;
        }
        if !leg.fail() {
            return;
        }
        self.counters.leg_failures.fetch_add(1, Relaxed);
        failed.push(leg.label.clone());
        drop(failed);
        tracing::warn!(leg = %leg.label, error = %e, "{what} failed: copy dropped");
        self.signal.lock().work = true;
        self.wake.notify_all();
    }

    /// After a fan-out: drop the legs that failed; succeed if a healthy leg
    /// took the operation.
    fn settle(
        &self,
        what: &str,
        legs: &[Arc<Leg>],
        results: Vec<StoreResult<()>>,
    ) -> StoreResult<()> {
        let mut done = false;
        let mut first_err = None;
        for (leg, r) in legs.iter().zip(results) {
            match r {
                Ok(()) => done |= leg.is_healthy(),
                Err(e) if is_caller_error(&e) => return Err(e),
                Err(e) => {
                    self.leg_failed(leg, &e, what);
                    first_err.get_or_insert(e);
                }
            }
        }
        if done {
            return Ok(());
        }
        let why = first_err.map_or("no leg left".to_string(), |e| e.to_string());
        Err(StoreError::Unavailable(format!("{what}: no copy took it: {why}")))
    }

    /// Whether to send an operation of `pages` pages to the legs at once.
    fn worth_parallel(&self, legs: &[Arc<Leg>], pages: u64) -> bool {
        pages >= fan::PARALLEL_MIN_PAGES && legs.iter().any(|l| !l.fast)
    }

    /// The live legs (healthy or rebuilding) of a snapshot.
    fn live(legs: &[Arc<Leg>]) -> Vec<Arc<Leg>> {
        legs.iter().filter(|l| !l.is_failed()).cloned().collect()
    }

    /// Healthy legs in the order a read of `page` tries them.
    fn read_order(&self, legs: &[Arc<Leg>], page: u64) -> Vec<Arc<Leg>> {
        let start = match self.opts.spread_reads {
            true => (page / SPREAD_CHUNK_PAGES) as usize % legs.len(),
            false => 0,
        };
        let rotated = legs[start..].iter().chain(&legs[..start]);
        rotated.filter(|l| l.is_healthy()).cloned().collect()
    }
}

fn pages_of(len_bytes: usize) -> u64 {
    (len_bytes / PAGE_SIZE) as u64
}

impl PageStore for Mirror {
    fn info(&self) -> StoreInfo {
        let legs = self.shared.snapshot();
        let infos: Vec<StoreInfo> = legs.iter().map(|l| l.store.info()).collect();
        let caps = Caps {
            durable: infos.iter().all(|i| i.caps.durable),
            discard_frees: infos.iter().all(|i| i.caps.discard_frees),
            fast: infos.iter().all(|i| i.caps.fast),
            checked: true,
        };
        let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
        StoreInfo { pages: self.shared.pages, caps, name: format!("mirror({})", names.join(", ")) }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        let s = &self.shared;
        for op in ops.iter() {
            check_run(s.pages, op.page, op.buf.len())?;
        }
        let Some(first) = ops.first().map(|op| op.page) else { return Ok(()) };
        let legs = s.snapshot();
        let mut last_err = None;
        for leg in s.read_order(&legs, first) {
            match leg.store.read(ops) {
                Ok(()) => return s.verify(ops, &leg, false),
                Err(e) if is_caller_error(&e) => return Err(e),
                // A leg that checks its own pages (an encrypted slab) found
                // a bad one. It returned the others, so check them all
                // against the sums: the bad ones are read from another
                // copy and rewritten here, as a lying leg's are.
                Err(e @ StoreError::Corrupt { .. }) => {
                    tracing::warn!(leg = %leg.label, error = %e, "bad copy; repairing from another");
                    return s.verify(ops, &leg, true);
                }
                Err(e) => {
                    s.leg_failed(&leg, &e, "read");
                    last_err = Some(e);
                }
            }
        }
        let why = last_err.map_or("no healthy leg".to_string(), |e| e.to_string());
        Err(StoreError::Unavailable(format!("no copy of page {first} could be read: {why}")))
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let s = &self.shared;
        let mut set = LockSet::new();
        for op in ops {
            set.add_run(op.page, check_run(s.pages, op.page, op.data.len())?);
        }
        let pages = ops.iter().flat_map(|op| op.data.chunks_exact(PAGE_SIZE));
        let crcs: Vec<u32> = match s.sums {
            Some(_) => pages.map(crc32c::crc32c).collect(),
            None => Vec::new(),
        };
        let _owned = s.locks.write(&set);
        let legs = Shared::live(&s.snapshot());
        let parallel = s.worth_parallel(&legs, pages_of(ops.iter().map(|op| op.data.len()).sum()));
        let results = fan::each(&legs, parallel, |leg| leg.store.write(ops));
        s.settle("write", &legs, results)?;
        let pages = ops.iter().flat_map(|op| (0..pages_of(op.data.len())).map(|i| op.page + i));
        for (i, page) in pages.enumerate() {
            if let Some(sums) = &s.sums {
                sums.set(page, crcs[i]);
            }
            s.written.set(page);
        }
        Ok(())
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        let s = &self.shared;
        check_range(s.pages, page, count)?;
        let _owned = s.locks.write(&LockSet::of_run(page, count));
        let legs = Shared::live(&s.snapshot());
        let results = fan::each(&legs, false, |leg| leg.store.discard(page, count));
        s.settle("discard", &legs, results)?;
        for p in page..page + count {
            if let Some(sums) = &s.sums {
                sums.set_zero(p);
            }
            s.written.clear(p);
        }
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        let s = &self.shared;
        let legs = Shared::live(&s.snapshot());
        let results = fan::each(&legs, s.worth_parallel(&legs, u64::MAX), |leg| leg.store.flush());
        s.settle("flush", &legs, results)
    }
}

#[cfg(test)]
mod tests;
