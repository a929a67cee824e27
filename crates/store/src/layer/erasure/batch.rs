//! Batched stripe updates. A write-back batch touches many stripes; each
//! stripe alone would cost a read of its missing data pages and k + m
//! single-page writes, one after another: 3 round trips a page for 2+1.
//! Here every stripe of a batch is updated under one set of locks, the
//! missing pages are read with one request per leg, and each leg gets one
//! write of its runs, the legs at once (`fan_out`). Writing every page of
//! 512 MiB over 2+1 loopback donors: 11 K pages/s a stripe at a time,
//! 84-94 K so (plain one-donor writes: 100-120 K in the same runs).

use super::Coded;
use crate::layer::fan_out::each_store;
use crate::page_locks::LockSet;
use crate::{PageStore, ReadOp, StoreError, StoreResult, WriteOp, PAGE_SIZE};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Most data pages (k a stripe) held at once by one batch: bounds its
/// buffers to 4 MiB of data plus parity.
const BATCH_PAGES: usize = 1024;

/// New data of one stripe: slot -> page.
pub(super) type Update<'a> = (u64, BTreeMap<usize, &'a [u8]>);

/// One leg's share of a batch: runs of consecutive leg pages.
struct LegJob {
    leg: usize,
    runs: Vec<(u64, Vec<u8>)>,
}

impl Coded {
    /// Apply `updates` (ascending stripes), `BATCH_PAGES` at a time.
    pub(super) fn write_stripes(&self, updates: &[Update<'_>]) -> StoreResult<()> {
        let per_batch = (BATCH_PAGES / self.k).max(1);
        updates.chunks(per_batch).try_for_each(|batch| self.write_batch(batch))
    }

    fn write_batch(&self, batch: &[Update<'_>]) -> StoreResult<()> {
        let mut set = LockSet::new();
        batch.iter().for_each(|(s, _)| set.add_run(*s, 1));
        let _owned = self.locks.write(&set);
        if let Some(e) = self.too_many_failed() {
            return Err(e);
        }
        let data = self.gather(batch)?;
        let k = self.k;
        let mut parity = Vec::with_capacity(batch.len());
        for shards in data.chunks_exact(k * PAGE_SIZE) {
            let p = reed_solomon_simd::encode(k, self.m, shards.chunks_exact(PAGE_SIZE))
                .map_err(|e| StoreError::Unavailable(format!("erasure coding: {e}")))?;
            parity.push(p);
        }
        let jobs = self.leg_jobs(batch, &data, &parity);
        self.write_legs(jobs)?;
        for (stripe, new) in batch {
            for (&j, d) in new {
                let p = stripe * k as u64 + j as u64;
                self.sums.set(p, crc32c::crc32c(d));
                self.written.set(p);
            }
        }
        Ok(())
    }

    /// The data shards of every stripe of `batch`, k pages a stripe: the
    /// new pages, zeroes for pages never written, the rest read (one
    /// request a leg) or, if their leg fails or lies, decoded.
    fn gather(&self, batch: &[Update<'_>]) -> StoreResult<Vec<u8>> {
        let k = self.k;
        let mut data = vec![0u8; batch.len() * k * PAGE_SIZE];
        let mut missing: Vec<Vec<(usize, u64)>> = vec![Vec::new(); k];
        for (i, (stripe, new)) in batch.iter().enumerate() {
            for (j, missing) in missing.iter_mut().enumerate() {
                let p = stripe * k as u64 + j as u64;
                let at = (i * k + j) * PAGE_SIZE;
                match new.get(&j) {
                    Some(d) => data[at..at + PAGE_SIZE].copy_from_slice(d),
                    None if p < self.pages && self.written.get(p) => missing.push((i, *stripe)),
                    None => {}
                }
            }
        }
        let read = self.read_legs(&missing);
        for (j, (wanted, got)) in missing.iter().zip(read).enumerate() {
            for (n, &(i, stripe)) in wanted.iter().enumerate() {
                let p = stripe * k as u64 + j as u64;
                let at = (i * k + j) * PAGE_SIZE;
                match got.as_ref().map(|b| &b[n * PAGE_SIZE..(n + 1) * PAGE_SIZE]) {
                    Some(page) if self.sums.matches(p, page) => {
                        data[at..at + PAGE_SIZE].copy_from_slice(page)
                    }
                    bad => {
                        if bad.is_some() {
                            self.counters.bad_copies.fetch_add(1, Relaxed);
                        }
                        self.counters.degraded_reads.fetch_add(1, Relaxed);
                        data[at..at + PAGE_SIZE].copy_from_slice(&self.decode(stripe, j)?);
                    }
                }
            }
        }
        Ok(data)
    }

    /// Read leg page `stripe` of each `(_, stripe)` in `missing[j]` from
    /// data leg j: the pages in order, or None where the leg is unreadable
    /// or failed (dropped as usual). One leg after another, as `read_run`
    /// does: these are the few pages at a batch's edges.
    fn read_legs(&self, missing: &[Vec<(usize, u64)>]) -> Vec<Option<Vec<u8>>> {
        let mut got = Vec::with_capacity(missing.len());
        for (j, wanted) in missing.iter().enumerate() {
            if wanted.is_empty() || !self.legs[j].readable() {
                got.push(None);
                continue;
            }
            let stripes: Vec<u64> = wanted.iter().map(|&(_, s)| s).collect();
            let mut buf = vec![0u8; stripes.len() * PAGE_SIZE];
            let store = self.legs[j].store();
            match store.read(&mut read_ops(&stripes, &mut buf)) {
                // An authenticating leg returned the good pages; the sums
                // find the bad ones.
                Ok(()) | Err(StoreError::Corrupt { .. }) => got.push(Some(buf)),
                Err(e) => {
                    self.leg_failed(j, &store, &e, "read");
                    got.push(None);
                }
            }
        }
        got
    }

    /// Each writable leg's runs: data leg j the stripes with new slot j,
    /// parity legs every stripe.
    fn leg_jobs(&self, batch: &[Update<'_>], data: &[u8], parity: &[Vec<Vec<u8>>]) -> Vec<LegJob> {
        let (k, m) = (self.k, self.m);
        let mut jobs: Vec<LegJob> =
            (0..k + m).map(|leg| LegJob { leg, runs: Vec::new() }).collect();
        for (i, (stripe, new)) in batch.iter().enumerate() {
            let pages = new
                .keys()
                .map(|&j| (j, &data[(i * k + j) * PAGE_SIZE..(i * k + j + 1) * PAGE_SIZE]))
                .chain(parity[i].iter().enumerate().map(|(r, s)| (k + r, &s[..])));
            for (leg, page) in pages {
                let runs = &mut jobs[leg].runs;
                match runs.last_mut() {
                    Some((first, buf)) if *first + (buf.len() / PAGE_SIZE) as u64 == *stripe => {
                        buf.extend_from_slice(page)
                    }
                    _ => runs.push((*stripe, page.to_vec())),
                }
            }
        }
        jobs.retain(|j| !j.runs.is_empty() && self.legs[j.leg].writable());
        jobs
    }

    /// Write every job's runs, the legs at once. A leg whose write fails
    /// is dropped unless that would leave too few (see `leg_failed`); the
    /// batch fails if any such error was kept or too many legs are gone.
    /// Then the stripes are inconsistent until a write of them succeeds:
    /// their sums still describe the old data, and the caller still holds
    /// the new.
    fn write_legs(&self, jobs: Vec<LegJob>) -> StoreResult<()> {
        let stores = self.leg_stores();
        let mut batches: Vec<Vec<LegJob>> = (0..stores.len()).map(|_| Vec::new()).collect();
        for job in jobs {
            let leg = job.leg;
            batches[leg].push(job);
        }
        let failed: Mutex<Vec<(usize, StoreError)>> = Mutex::new(Vec::new());
        each_store(&stores, batches, |store, jobs| {
            for job in jobs.iter() {
                let ops: Vec<WriteOp<'_>> =
                    job.runs.iter().map(|(page, data)| WriteOp { page: *page, data }).collect();
                if let Err(e) = store.write(&ops) {
                    failed.lock().push((job.leg, e));
                }
            }
            Ok(())
        })?;
        let mut kept = None;
        for (leg, e) in failed.into_inner() {
            if !self.leg_failed(leg, &stores[leg], &e, "write") {
                kept = Some(e);
            }
        }
        match self.too_many_failed().or(kept) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn leg_stores(&self) -> Vec<Arc<dyn PageStore>> {
        self.legs.iter().map(|l| l.store()).collect()
    }
}

/// Read ops for leg pages `stripes` (ascending) into `buf`, one op per run
/// of consecutive pages.
fn read_ops<'a>(stripes: &[u64], buf: &'a mut [u8]) -> Vec<ReadOp<'a>> {
    let mut ops = Vec::new();
    let mut rest = buf;
    let mut i = 0;
    while i < stripes.len() {
        let mut n = 1;
        while i + n < stripes.len() && stripes[i + n] == stripes[i] + n as u64 {
            n += 1;
        }
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(n * PAGE_SIZE);
        ops.push(ReadOp { page: stripes[i], buf: mine });
        rest = tail;
        i += n;
    }
    ops
}
