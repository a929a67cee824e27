//! `watermark`: calls a hook once, the first time a write reaches a page
//! mark. Whoever built the stack uses it to start what the next writes will
//! need before they need it: `borrow` leases a region's next segment when
//! writes reach half of the one before, so a write-back into the next
//! segment finds its lease there instead of waiting for the control plane.
//!
//! The hook runs on the writing thread, before the write, and must not
//! block: it only queues work for another thread.

use crate::InPlace;
use crate::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Called once, by the first write that reaches the mark.
pub type Hook = Box<dyn Fn() + Send + Sync>;

pub struct Watermark {
    inner: Arc<dyn PageStore>,
    mark_page: u64,
    hook: Hook,
    fired: AtomicBool,
}

impl Watermark {
    /// Wraps `inner`; `hook` runs when a write first covers `mark_page` or
    /// any page after it.
    pub fn new(inner: Arc<dyn PageStore>, mark_page: u64, hook: Hook) -> Self {
        Watermark { inner, mark_page, hook, fired: AtomicBool::new(false) }
    }

    fn reached(&self, ops: &[WriteOp<'_>]) -> bool {
        ops.iter().any(|op| op.page + (op.data.len() / PAGE_SIZE) as u64 > self.mark_page)
    }
}

impl PageStore for Watermark {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        // Relaxed load first: after the one time it fires, a write pays a
        // load and no read-modify-write.
        if !self.fired.load(Ordering::Relaxed)
            && self.reached(ops)
            && !self.fired.swap(true, Ordering::AcqRel)
        {
            (self.hook)();
        }
        self.inner.write(ops)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.inner.discard(page, count)
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }

    fn in_place(&self, page: u64, count: u64) -> Option<StoreResult<InPlace>> {
        self.inner.in_place(page, count)
    }

    fn allocation(
        &self,
        page: u64,
        count: u64,
        out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        self.inner.allocation(page, count, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    fn page(seed: u8) -> Vec<u8> {
        vec![seed; PAGE_SIZE]
    }

    /// A hook that counts its calls.
    fn counting() -> (Hook, Arc<AtomicU64>) {
        let fired = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&fired);
        let hook: Hook = Box::new(move || {
            count.fetch_add(1, SeqCst);
        });
        (hook, fired)
    }

    #[test]
    fn the_hook_fires_once_at_the_mark_and_bytes_pass_through() {
        let (hook, fired) = counting();
        let ram = Arc::new(RamStore::new(16, RamOptions::default()).unwrap());
        let w = Watermark::new(ram, 8, hook);
        // Pages 4..8 end just below the mark.
        let run = vec![3u8; 4 * PAGE_SIZE];
        w.write(&[WriteOp { page: 4, data: &run }]).unwrap();
        assert_eq!(fired.load(SeqCst), 0, "below the mark");
        std::thread::scope(|s| {
            for t in 8..16u8 {
                let w = &w;
                s.spawn(move || w.write(&[WriteOp { page: t as u64, data: &page(t) }]).unwrap());
            }
        });
        assert_eq!(fired.load(SeqCst), 1, "eight writers past the mark fire it once");
        for t in 8..16u8 {
            let mut buf = page(0);
            w.read(&mut [ReadOp { page: t as u64, buf: &mut buf }]).unwrap();
            assert_eq!(buf, page(t), "page {t}");
        }
        let mut buf = page(0);
        w.read(&mut [ReadOp { page: 5, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page(3));
        assert_eq!(w.info().pages, 16);
    }

    #[test]
    fn a_run_that_crosses_the_mark_fires_it() {
        let (hook, fired) = counting();
        let w =
            Watermark::new(Arc::new(RamStore::new(16, RamOptions::default()).unwrap()), 8, hook);
        let run = vec![1u8; 2 * PAGE_SIZE];
        w.write(&[WriteOp { page: 7, data: &run }]).unwrap();
        assert_eq!(fired.load(SeqCst), 1);
    }
}
