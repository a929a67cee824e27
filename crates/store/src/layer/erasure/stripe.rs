//! Reading runs, decoding lost shards and rewriting stripes.

use super::Coded;
use crate::{ReadOp, StoreError, StoreResult, PAGE_SIZE};
use std::sync::atomic::Ordering::Relaxed;

impl Coded {
    /// Read `page..` into `buf`: one call per data leg for the whole run,
    /// then every page checked; a bad or unreachable one is decoded. The
    /// legs are read one after another: on two cores, a sequential read ran
    /// 85 K pages/s so and 62 K with the legs on `fan_out` threads (a spawn
    /// per call costs more than the round trip it overlaps).
    pub(super) fn read_run(&self, page: u64, buf: &mut [u8]) -> StoreResult<()> {
        let k = self.k as u64;
        let count = (buf.len() / PAGE_SIZE) as u64;
        let mut ok = vec![false; count as usize];
        for d in 0..self.k {
            // Logical pages of this run on leg d: first p >= page with p % k == d.
            let first = page + ((d as u64 + k - page % k) % k);
            if first >= page + count || !self.legs[d].readable() {
                continue;
            }
            let n = (page + count - first).div_ceil(k);
            let mut bounce = vec![0u8; n as usize * PAGE_SIZE];
            let leg_op = ReadOp { page: first / k, buf: &mut bounce };
            let store = self.legs[d].store();
            match store.read(&mut [leg_op]) {
                // A leg that authenticates its pages (an encrypted slab)
                // found some bad: it returned the rest, and the sums below
                // send the bad ones to `degraded`. A bad shard, not a dead leg.
                Ok(()) | Err(StoreError::Corrupt { .. }) => {}
                Err(e) => {
                    self.leg_failed(d, &store, &e, "read");
                    continue;
                }
            }
            for (i, src) in bounce.chunks_exact(PAGE_SIZE).enumerate() {
                let p = first + i as u64 * k;
                let at = (p - page) as usize;
                buf[at * PAGE_SIZE..(at + 1) * PAGE_SIZE].copy_from_slice(src);
                ok[at] = self.sums.matches(p, src);
            }
        }
        for (at, good) in ok.iter().enumerate() {
            if !good {
                let p = page + at as u64;
                self.degraded(p, &mut buf[at * PAGE_SIZE..(at + 1) * PAGE_SIZE])?;
            }
        }
        Ok(())
    }

    /// Rebuild page `p` from the other shards of its stripe.
    fn degraded(&self, p: u64, buf: &mut [u8]) -> StoreResult<()> {
        let stripe = p / self.k as u64;
        let _shared = self.locks.read(&self.stripe_lock(stripe));
        if self.legs[(p % self.k as u64) as usize].readable() {
            // A read that raced a writer, or a leg that lied: ask again.
            match self.read_shard(stripe, (p % self.k as u64) as usize, Some(p)) {
                Ok(d) => {
                    buf.copy_from_slice(&d);
                    return Ok(());
                }
                Err(StoreError::Corrupt { .. }) => {
                    self.counters.bad_copies.fetch_add(1, Relaxed);
                }
                // A leg kept after an error (see `leg_failed`).
                Err(_) => {}
            }
        }
        let d = self.decode(stripe, (p % self.k as u64) as usize)?;
        buf.copy_from_slice(&d);
        self.counters.degraded_reads.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Shard `j` of `stripe` from its leg: a data page checked against its
    /// sum when `page` is given, or a parity page.
    fn read_shard(&self, stripe: u64, j: usize, page: Option<u64>) -> StoreResult<Vec<u8>> {
        let mut data = vec![0u8; PAGE_SIZE];
        let store = self.legs[j].store();
        if let Err(e) = store.read(&mut [ReadOp { page: stripe, buf: &mut data }]) {
            if !matches!(e, StoreError::Corrupt { .. }) {
                self.leg_failed(j, &store, &e, "read");
            }
            return Err(e);
        }
        match page {
            Some(p) if !self.sums.matches(p, &data) => {
                let (expected, actual) = (self.sums.expected(p), crc32c::crc32c(&data));
                Err(StoreError::Corrupt { page: p, expected, actual })
            }
            _ => Ok(data),
        }
    }

    /// Data shard `d` of `stripe`, decoded from k other shards. The caller
    /// holds the stripe's lock (shared or owned).
    pub(super) fn decode(&self, stripe: u64, d: usize) -> StoreResult<Vec<u8>> {
        let (k, m) = (self.k, self.m);
        let page = stripe * k as u64 + d as u64;
        let mut originals: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut recovery: Vec<(usize, Vec<u8>)> = Vec::new();
        // Readable legs that failed to answer (kept after an error): the
        // page may be whole again once they do, so it is not counted lost.
        let mut silent = 0;
        for j in (0..k).filter(|&j| j != d) {
            let p = stripe * k as u64 + j as u64;
            if p >= self.pages {
                originals.push((j, vec![0u8; PAGE_SIZE]));
            } else if self.legs[j].readable() {
                match self.read_shard(stripe, j, Some(p)) {
                    Ok(s) => originals.push((j, s)),
                    Err(StoreError::Corrupt { .. }) => {}
                    Err(_) => silent += 1,
                }
            }
        }
        for i in 0..m {
            if originals.len() + recovery.len() >= k {
                break;
            }
            if self.legs[k + i].readable() {
                match self.read_shard(stripe, k + i, None) {
                    Ok(s) => recovery.push((i, s)),
                    Err(StoreError::Corrupt { .. }) => {}
                    Err(_) => silent += 1,
                }
            }
        }
        let shards = originals.len() + recovery.len();
        if shards < k && (silent > 0 || self.legs[d].readable()) {
            return Err(StoreError::Unavailable(format!(
                "page {page}: {shards} of {k} shards answered; legs that failed are kept, try again"
            )));
        }
        let lost = |why: String| {
            self.counters.lost_pages.fetch_add(1, Relaxed);
            tracing::error!(page, %why, "a page cannot be rebuilt from its stripe");
            StoreError::Unavailable(format!("page {page} cannot be rebuilt: {why}"))
        };
        if originals.len() + recovery.len() < k {
            return Err(lost(format!("{} of {k} shards left", originals.len() + recovery.len())));
        }
        let decoded = reed_solomon_simd::decode(k, m, originals, recovery)
            .map_err(|e| lost(e.to_string()))?;
        let data = decoded.get(&d).cloned().ok_or_else(|| lost("decoder left it out".into()))?;
        if !self.sums.matches(page, &data) {
            return Err(lost("the decoded page fails its checksum".into()));
        }
        Ok(data)
    }

    /// The current contents of data slot `j` (page `p`); the caller owns the
    /// stripe.
    pub(super) fn current(&self, stripe: u64, j: usize, p: u64) -> StoreResult<Vec<u8>> {
        if self.legs[j].readable() {
            if let Ok(d) = self.read_shard(stripe, j, Some(p)) {
                return Ok(d);
            }
            self.counters.bad_copies.fetch_add(1, Relaxed);
        }
        self.counters.degraded_reads.fetch_add(1, Relaxed);
        self.decode(stripe, j)
    }
}
