//! Page atomicity without per-page metadata: a fixed table of reader-writer
//! locks ("stripes"), page `p` guarded by stripe `p % STRIPES`. The layers,
//! the `ram` and `file` backends and the NBD export's read-modify-write all
//! take their page locks here.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Number of stripe locks; a power of two. Page `p` maps to stripe
/// `p % STRIPES`, so a run of consecutive pages spreads over many stripes.
pub const STRIPES: usize = 1024;
const WORDS: usize = STRIPES / 64;

/// A fixed table of reader-writer locks that makes each page atomic without
/// per-page metadata: whoever holds a page's stripe for writing is the only
/// one touching that page.
pub struct PageLocks {
    locks: Box<[RwLock<()>]>,
}

/// The set of stripes that some page runs touch, kept as a bitmap so that
/// locking takes each stripe once and in ascending order. One global order
/// means two threads locking overlapping sets cannot deadlock, and taking a
/// stripe once means no thread ever waits on itself.
pub struct LockSet {
    bits: [u64; WORDS],
}

impl Default for LockSet {
    fn default() -> Self {
        LockSet::new()
    }
}

impl LockSet {
    pub fn new() -> Self {
        LockSet { bits: [0; WORDS] }
    }

    /// The stripes of one run of pages.
    pub fn of_run(page: u64, count: u64) -> Self {
        let mut set = LockSet::new();
        set.add_run(page, count);
        set
    }

    /// Add the stripes of `page..page + count`.
    pub fn add_run(&mut self, page: u64, count: u64) {
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

impl Default for PageLocks {
    fn default() -> Self {
        PageLocks::new()
    }
}

impl PageLocks {
    pub fn new() -> Self {
        PageLocks { locks: (0..STRIPES).map(|_| RwLock::new(())).collect() }
    }

    /// Share every stripe of `set` (readers of those pages).
    pub fn read(&self, set: &LockSet) -> Vec<RwLockReadGuard<'_, ()>> {
        set.iter().map(|s| self.locks[s].read()).collect()
    }

    /// Own every stripe of `set` (writers and discarders of those pages).
    pub fn write(&self, set: &LockSet) -> Vec<RwLockWriteGuard<'_, ()>> {
        set.iter().map(|s| self.locks[s].write()).collect()
    }

    /// Share the stripe of one page.
    pub fn read_page(&self, page: u64) -> RwLockReadGuard<'_, ()> {
        self.locks[page as usize & (STRIPES - 1)].read()
    }

    /// Own the stripe of one page.
    pub fn write_page(&self, page: u64) -> RwLockWriteGuard<'_, ()> {
        self.locks[page as usize & (STRIPES - 1)].write()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_set_takes_each_stripe_once_in_order() {
        let mut set = LockSet::of_run(STRIPES as u64 - 2, 4);
        set.add_run(1, 1);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 1, STRIPES - 2, STRIPES - 1]);
        assert_eq!(LockSet::of_run(5, STRIPES as u64).iter().count(), STRIPES);
        assert_eq!(LockSet::of_run(u64::MAX - 1, 1).iter().count(), 1);
        assert_eq!(LockSet::new().iter().count(), 0);
    }

    #[test]
    fn overlapping_sets_lock_without_deadlock() {
        let locks = PageLocks::new();
        let a = LockSet::of_run(0, 8);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..500u64 {
                        let _w = locks.write(&LockSet::of_run(i % 8, 3));
                        drop(_w);
                        let _r = locks.read(&a);
                    }
                });
            }
        });
    }
}
