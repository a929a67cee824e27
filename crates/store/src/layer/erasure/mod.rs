//! `erasure`: pages spread over k data stores with m parity stores (Reed-
//! Solomon, `reed-solomon-simd`), so any m stores can fail with nothing
//! lost, for (k+m)/k of the memory instead of a mirror's 2x.
//!
//! Layout. Logical page p is in stripe s = p / k, on data leg p % k, at leg
//! page s. Parity leg j holds parity shard j of stripe s at leg page s.
//!
//! Writes update whole stripes: under the stripe's lock, the stripe's other
//! data pages are read (pages never written are zero and are not read), the
//! m parity pages computed and written with the new data. A single-page
//! write so costs up to k-1 reads and 1+m writes: erasure coding is the
//! memory-lean choice, not the fast one. A leg whose read or write fails is
//! dropped; a stripe stays decodable as long as at most m legs are.
//!
//! Reads go to the page's data leg and are checked against a CRC32C kept
//! here (4 B/page). A page whose leg failed, or that fails its sum, is
//! decoded from k other shards of its stripe (degraded read), under the
//! stripe's shared lock so no write is half done meanwhile.
//!
//! Not here yet: rebuilding a dropped leg on a spare (a mirror does that;
//! see `mirror`).

mod stripe;

use super::table::{Bitmap, Sums};
use super::{StripeLocks, StripeSet};
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo};
use crate::{StoreResult, WriteOp, PAGE_SIZE};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Most legs (data + parity).
pub const MAX_LEGS: usize = 16;

struct Leg {
    store: Arc<dyn PageStore>,
    label: String,
    failed: AtomicBool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErasureStats {
    pub data_legs: usize,
    pub parity_legs: usize,
    pub healthy_legs: usize,
    /// Pages rebuilt from other shards because their leg failed or lied.
    pub degraded_reads: u64,
    /// Pages a leg returned with the wrong contents.
    pub bad_copies: u64,
    /// Pages no combination of shards could rebuild.
    pub lost_pages: u64,
}

#[derive(Default)]
struct Counters {
    degraded_reads: AtomicU64,
    bad_copies: AtomicU64,
    lost_pages: AtomicU64,
}

pub struct Erasure {
    legs: Box<[Leg]>,
    k: usize,
    m: usize,
    pages: u64,
    sums: Sums,
    written: Bitmap,
    /// Keyed by stripe number.
    locks: StripeLocks,
    counters: Counters,
}

impl Erasure {
    /// `data` legs then `parity` legs, each (store, label), fresh (reading
    /// zeroes) and holding at least `pages / k` rounded up.
    pub fn new(
        data: Vec<(Arc<dyn PageStore>, String)>,
        parity: Vec<(Arc<dyn PageStore>, String)>,
        pages: u64,
    ) -> StoreResult<Erasure> {
        let (k, m) = (data.len(), parity.len());
        if k == 0 || m == 0 || k + m > MAX_LEGS {
            let why =
                format!("erasure coding needs k >= 1, m >= 1, k + m <= {MAX_LEGS}; got {k}+{m}");
            return Err(StoreError::Unavailable(why));
        }
        let per_leg = pages.div_ceil(k as u64);
        if let Some((s, l)) = data.iter().chain(&parity).find(|(s, _)| s.info().pages < per_leg) {
            let has = s.info().pages;
            return Err(StoreError::NoSpace(format!("leg {l} holds {has} pages, not {per_leg}")));
        }
        let legs = data.into_iter().chain(parity).map(|(store, label)| Leg {
            store,
            label,
            failed: AtomicBool::new(false),
        });
        Ok(Erasure {
            legs: legs.collect(),
            k,
            m,
            pages,
            sums: Sums::new(pages)?,
            written: Bitmap::new(pages, "written bits")?,
            locks: StripeLocks::new(),
            counters: Counters::default(),
        })
    }

    pub fn stats(&self) -> ErasureStats {
        let c = &self.counters;
        ErasureStats {
            data_legs: self.k,
            parity_legs: self.m,
            healthy_legs: self.legs.iter().filter(|l| !l.failed.load(Relaxed)).count(),
            degraded_reads: c.degraded_reads.load(Relaxed),
            bad_copies: c.bad_copies.load(Relaxed),
            lost_pages: c.lost_pages.load(Relaxed),
        }
    }

    fn leg_failed(&self, leg: usize, e: &StoreError, what: &str) {
        let l = &self.legs[leg];
        if !l.failed.swap(true, Relaxed) {
            tracing::warn!(leg = %l.label, error = %e, "{what} failed: shard dropped");
        }
    }

    fn failed_legs(&self) -> usize {
        self.legs.iter().filter(|l| l.failed.load(Relaxed)).count()
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
        let names: Vec<String> = self.legs.iter().map(|l| l.store.info().name).collect();
        let caps = Caps { durable: false, discard_frees: true, fast: false };
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
        for (stripe, pages) in &new {
            self.write_stripe(*stripe, pages)?;
        }
        Ok(())
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        let zero = [0u8; PAGE_SIZE];
        let mut stripe = page / self.k as u64;
        let end = page + count;
        while stripe * (self.k as u64) < end {
            let first = (stripe * self.k as u64).max(page);
            let last = ((stripe + 1) * self.k as u64).min(end);
            let pages: BTreeMap<usize, &[u8]> =
                (first..last).map(|p| ((p % self.k as u64) as usize, &zero[..])).collect();
            self.write_stripe(stripe, &pages)?;
            stripe += 1;
        }
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        Ok(())
    }
}

impl Erasure {
    fn stripe_lock(&self, stripe: u64) -> StripeSet {
        StripeSet::of_run(stripe, 1)
    }
}

#[cfg(test)]
mod tests;
