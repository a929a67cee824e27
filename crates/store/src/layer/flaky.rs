//! A store that fails or lies on command, for the layers' tests: the faults
//! a donor has.

use crate::ram::{RamOptions, RamStore};
use crate::{PageStore, ReadOp, StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// A store that fails, stalls or lies on command: the faults a donor has.
pub(crate) struct Flaky {
    pub inner: RamStore,
    pub dead: AtomicBool,
    /// Reads of this page (+1; 0 = none) return flipped bytes.
    pub lie_about: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
}

impl Flaky {
    pub fn new(pages: u64) -> Arc<Flaky> {
        let inner = RamStore::new(pages, RamOptions::default()).unwrap();
        let (dead, lie_about) = (AtomicBool::new(false), AtomicU64::new(0));
        let (reads, writes) = (AtomicU64::new(0), AtomicU64::new(0));
        Arc::new(Flaky { inner, dead, lie_about, reads, writes })
    }

    fn check(&self) -> StoreResult<()> {
        match self.dead.load(SeqCst) {
            true => Err(StoreError::Unavailable("donor gone".into())),
            false => Ok(()),
        }
    }
}

impl PageStore for Flaky {
    fn info(&self) -> StoreInfo {
        StoreInfo { name: "flaky".into(), ..self.inner.info() }
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.check()?;
        self.reads.fetch_add(1, SeqCst);
        self.inner.read(ops)?;
        let lie = self.lie_about.load(SeqCst);
        for op in ops
            .iter_mut()
            .filter(|op| lie > op.page && lie <= op.page + (op.buf.len() / PAGE_SIZE) as u64)
        {
            op.buf[(lie - 1 - op.page) as usize * PAGE_SIZE] ^= 0xff;
        }
        Ok(())
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.check()?;
        self.writes.fetch_add(1, SeqCst);
        self.inner.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.check()?;
        self.inner.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.check()
    }
}
