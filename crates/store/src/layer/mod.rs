//! Layers: stores that wrap another store and add one property each.
//!
//! A layer takes any `S: PageStore` (including `Arc<dyn PageStore>`), forwards
//! every operation to it and adds its one property on the way: `checksum`
//! verifies every page, `crypt` encrypts every page so the store below holds
//! only ciphertext, `stats` counts and times every operation, `stripe`
//! spreads pages over several stores (donors), `concat` joins stores of
//! any sizes end to end (leases), `mirror` keeps every page on two or more
//! stores and rebuilds a lost copy, `relocate` moves pages while in use,
//! `lost` stands in for a store whose pages are gone, `local_tags` keeps
//! a sidecar per page for a store that has none (for `crypt`). The inner
//! store never knows it is wrapped. A layer's `StoreInfo::name` wraps the
//! inner name, so a stack reads as it is built: `checksum(stats(ram))`.
//!
//! This module also holds [`StripeLocks`], the page-atomicity tool shared by
//! the layers and the `file` backend.

pub mod checksum;
pub mod concat;
pub mod crypt;
pub mod erasure;
mod fan_out;
#[cfg(test)]
mod flaky;
pub mod local_tags;
pub mod lost;
pub mod mirror;
pub mod relocate;
pub mod stats;
pub mod stripe;
mod table;

pub use checksum::Checksum;
pub use concat::Concat;
pub use crypt::Crypt;
pub use erasure::{Erasure, ErasureStats};
pub use local_tags::LocalTags;
pub use lost::Lost;
pub use mirror::{Mirror, MirrorOptions, MirrorStats};
pub use relocate::Relocatable;
pub use stats::{OpSnapshot, Stats, StatsSnapshot};
pub use stripe::Stripe;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Number of stripe locks; a power of two. Page `p` maps to stripe
/// `p % STRIPES`, so a run of consecutive pages spreads over many stripes.
pub(crate) const STRIPES: usize = 1024;
const WORDS: usize = STRIPES / 64;

/// A fixed table of reader-writer locks that makes each page atomic without
/// per-page metadata: whoever holds a page's stripe for writing is the only
/// one touching that page.
pub(crate) struct StripeLocks {
    locks: Box<[RwLock<()>]>,
}

/// The set of stripes that some page runs touch, kept as a bitmap so that
/// locking takes each stripe once and in ascending order. One global order
/// means two threads locking overlapping sets cannot deadlock, and taking a
/// stripe once means no thread ever waits on itself.
pub(crate) struct StripeSet {
    bits: [u64; WORDS],
}

impl StripeSet {
    pub(crate) fn new() -> Self {
        StripeSet { bits: [0; WORDS] }
    }

    /// The stripes of one run of pages.
    pub(crate) fn of_run(page: u64, count: u64) -> Self {
        let mut set = StripeSet::new();
        set.add_run(page, count);
        set
    }

    /// Add the stripes of `page..page + count`.
    pub(crate) fn add_run(&mut self, page: u64, count: u64) {
        if count >= STRIPES as u64 {
            self.bits = [u64::MAX; WORDS];
            return;
        }
        for p in page..page.saturating_add(count) {
            let stripe = p as usize & (STRIPES - 1);
            self.bits[stripe / 64] |= 1 << (stripe % 64);
        }
    }

    /// Stripe indices in ascending order.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..WORDS).flat_map(move |w| {
            let mut word = self.bits[w];
            // Pops the lowest set bit each step: at most 64 steps a word.
            std::iter::from_fn(move || {
                let bit = (word != 0).then(|| word.trailing_zeros() as usize)?;
                word &= word - 1;
                Some(w * 64 + bit)
            })
        })
    }
}

impl StripeLocks {
    pub(crate) fn new() -> Self {
        StripeLocks { locks: (0..STRIPES).map(|_| RwLock::new(())).collect() }
    }

    /// Share every stripe of `set` (readers of those pages).
    pub(crate) fn read(&self, set: &StripeSet) -> Vec<RwLockReadGuard<'_, ()>> {
        set.iter().map(|s| self.locks[s].read()).collect()
    }

    /// Own every stripe of `set` (writers and discarders of those pages).
    pub(crate) fn write(&self, set: &StripeSet) -> Vec<RwLockWriteGuard<'_, ()>> {
        set.iter().map(|s| self.locks[s].write()).collect()
    }

    /// Share the stripe of one page.
    pub(crate) fn read_page(&self, page: u64) -> RwLockReadGuard<'_, ()> {
        self.locks[page as usize & (STRIPES - 1)].read()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_set_takes_each_stripe_once_in_order() {
        let mut set = StripeSet::of_run(STRIPES as u64 - 2, 4);
        set.add_run(1, 1);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 1, STRIPES - 2, STRIPES - 1]);
        assert_eq!(StripeSet::of_run(5, STRIPES as u64).iter().count(), STRIPES);
        assert_eq!(StripeSet::of_run(u64::MAX - 1, 1).iter().count(), 1);
        assert_eq!(StripeSet::new().iter().count(), 0);
    }

    #[test]
    fn overlapping_sets_lock_without_deadlock() {
        let locks = StripeLocks::new();
        let a = StripeSet::of_run(0, 8);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..500u64 {
                        let _w = locks.write(&StripeSet::of_run(i % 8, 3));
                        drop(_w);
                        let _r = locks.read(&a);
                    }
                });
            }
        });
    }
}
