//! Checking what a leg returned against the sums, and repairing bad copies.

use super::{Leg, Shared};
use crate::{PageStore, ReadOp, StoreError, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Shared {
    /// Check every page `leg` returned in `ops` (`corrupt`: it said some
    /// were bad); replace bad ones with a good copy from another leg and
    /// rewrite them on `leg`.
    pub(super) fn verify(
        &self,
        ops: &mut [ReadOp<'_>],
        leg: &Arc<Leg>,
        corrupt: bool,
    ) -> StoreResult<()> {
        let mut first_err = None;
        for op in ops.iter_mut() {
            for (i, buf) in op.buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let page = op.page + i as u64;
                if !self.suspect(page, buf, corrupt) {
                    continue;
                }
                if let Err(e) = self.recover(page, buf, leg) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Whether `page`, read into `buf` from a leg, must be read again: with
    /// sums, one that fails its sum; without, one the leg zeroed after it
    /// reported a bad page (a page that really is zero is only read again).
    pub(super) fn suspect(&self, page: u64, buf: &[u8], corrupt: bool) -> bool {
        match &self.sums {
            Some(sums) => !sums.matches(page, buf),
            None => corrupt && buf.iter().all(|&b| b == 0),
        }
    }

    /// A page that failed its sum in a lockless read. Under the page's shared
    /// stripe lock no writer is between data and sum, so a second mismatch
    /// is a bad copy, not a race.
    fn recover(&self, page: u64, buf: &mut [u8], bad: &Arc<Leg>) -> StoreResult<()> {
        let good = {
            let _shared = self.locks.read_page(page);
            let expected = self.sums.as_ref().map_or(0, |s| s.expected(page));
            match self.read_verified(page, buf, bad) {
                Ok(()) => return Ok(()),
                Err(StoreError::Corrupt { .. }) => {
                    self.counters.bad_copies.fetch_add(1, Relaxed);
                    tracing::warn!(leg = %bad.label, page, expected, "bad copy; reading another");
                }
                Err(e) => self.leg_failed(bad, &e, "read"),
            }
            let others = self.snapshot();
            let good = others
                .iter()
                .filter(|l| !Arc::ptr_eq(l, bad) && l.is_healthy())
                .find(|l| self.read_verified(page, buf, l).is_ok());
            let Some(good) = good.cloned() else {
                self.counters.lost_pages.fetch_add(1, Relaxed);
                tracing::error!(page, "no leg holds a good copy of the page");
                let actual = crc32c::crc32c(buf);
                return Err(StoreError::Corrupt { page, expected, actual });
            };
            good
        };
        if !bad.is_failed() {
            self.repair(page, &good, bad);
        }
        Ok(())
    }

    /// Read one page from `leg` and check it (a leg that checks its own
    /// pages has, when there are no sums).
    pub(super) fn read_verified(&self, page: u64, buf: &mut [u8], leg: &Leg) -> StoreResult<()> {
        leg.store.read(&mut [ReadOp { page, buf: &mut *buf }])?;
        match &self.sums {
            Some(sums) if !sums.matches(page, buf) => {
                let (expected, actual) = (sums.expected(page), crc32c::crc32c(buf));
                Err(StoreError::Corrupt { page, expected, actual })
            }
            _ => Ok(()),
        }
    }

    /// Rewrite `page` on `bad` from `good`, owning the page meanwhile so no
    /// newer write is overwritten. Best effort: a failure drops `bad`.
    fn repair(&self, page: u64, good: &Leg, bad: &Leg) {
        let _owned = self.locks.write(&super::LockSet::of_run(page, 1));
        let mut copy = vec![0u8; PAGE_SIZE];
        if self.read_verified(page, &mut copy, good).is_err() {
            return;
        }
        match bad.store.write(&[WriteOp { page, data: &copy }]) {
            Ok(()) => {
                self.counters.repaired_pages.fetch_add(1, Relaxed);
                tracing::info!(leg = %bad.label, page, "bad copy rewritten");
            }
            Err(e) => self.leg_failed(bad, &e, "repair"),
        }
    }
}
