//! `relocate`: a store whose pages can move to another store while it is in
//! use. When a donor reclaims a lease, the lease's pages move to another
//! donor or home; the program keeps reading and writing throughout.
//!
//! How it stays correct. The old store stays authoritative until the very
//! end: every read goes to it, every write and discard goes to it. A copier
//! walks the pages in batches with a cursor; a write to pages below the
//! cursor (already copied) goes to the target too. A batch copy and a write
//! of the same pages cannot interleave, because both hold those pages'
//! stripe locks (`PageLocks`), so "copied or not" is fixed for a writer's
//! pages while it writes. At the end the copier takes the state lock for
//! writing (no operation in flight) and makes the target current. If the
//! copy fails, passes its deadline or is cancelled, the target is dropped
//! and nothing changed: the old store has every write.
//!
//! Fast path: with no move under way, an operation costs one uncontended
//! read lock over the inner store.

use crate::page_locks::{LockSet, PageLocks};
use crate::{PageStore, ReadOp, StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use thiserror::Error;

/// Most pages one copy batch holds locked.
pub const BATCH_PAGES_MAX: u64 = 1024;

#[derive(Clone, Copy, Debug)]
pub struct RelocateOptions {
    pub batch_pages: u64,
    /// Give up (leaving everything on the old store) after this.
    pub deadline: Option<Instant>,
}

impl Default for RelocateOptions {
    fn default() -> RelocateOptions {
        RelocateOptions { batch_pages: 64, deadline: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub pages_copied: u64,
    pub pages_total: u64,
}

pub struct RelocateReport {
    pub pages_copied: u64,
    /// The store the pages left; the caller frees it (closes the slab,
    /// releases the lease).
    pub old: Arc<dyn PageStore>,
}

#[derive(Debug, Error)]
pub enum RelocateError {
    #[error("a relocation is already under way")]
    Busy,
    #[error("the target holds {target} pages, fewer than the {needed} to move")]
    TooSmall { target: u64, needed: u64 },
    #[error("deadline passed after {copied} of {total} pages; nothing moved")]
    DeadlineExceeded { copied: u64, total: u64 },
    #[error("cancelled after {copied} of {total} pages; nothing moved")]
    Cancelled { copied: u64, total: u64 },
    #[error("copy failed at page {page}: {source}; nothing moved")]
    Store { page: u64, source: StoreError },
}

struct Moving {
    target: Arc<dyn PageStore>,
    /// Pages below this are on the target too.
    cursor: AtomicU64,
    /// A write to the target failed: the old store has it, the move is off.
    failed: Mutex<Option<(u64, StoreError)>>,
}

impl Moving {
    /// Mirror a write or discard to the target. Its failure never fails the
    /// caller (the old store has the data); it ends the move instead.
    fn mirror(&self, page: u64, r: StoreResult<()>) {
        if let Err(e) = r {
            self.failed.lock().get_or_insert((page, e));
        }
    }
}

struct State {
    current: Arc<dyn PageStore>,
    moving: Option<Arc<Moving>>,
}

pub struct Relocatable {
    state: RwLock<State>,
    locks: PageLocks,
    busy: Mutex<()>,
    cancel: AtomicBool,
}

impl Relocatable {
    pub fn new(store: Arc<dyn PageStore>) -> Relocatable {
        let state = State { current: store, moving: None };
        Relocatable {
            state: RwLock::new(state),
            locks: PageLocks::new(),
            busy: Mutex::new(()),
            cancel: AtomicBool::new(false),
        }
    }

    pub fn current(&self) -> Arc<dyn PageStore> {
        Arc::clone(&self.state.read().current)
    }

    /// Put `store` in the current one's place at once, copying nothing: for
    /// a store whose pages are gone anyway. Returns the old store.
    pub fn replace(&self, store: Arc<dyn PageStore>) -> Result<Arc<dyn PageStore>, RelocateError> {
        let _one = self.busy.try_lock().ok_or(RelocateError::Busy)?;
        let mut st = self.state.write();
        let (have, needed) = (store.info().pages, st.current.info().pages);
        if have < needed {
            return Err(RelocateError::TooSmall { target: have, needed });
        }
        assert!(st.moving.is_none(), "a move holds the busy lock");
        Ok(std::mem::replace(&mut st.current, store))
    }

    /// Ask a running relocation to stop (it returns `Cancelled`).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Copy every page to `target`, then make it current. See the module
    /// comment for what holds while this runs.
    pub fn relocate(
        &self,
        target: Arc<dyn PageStore>,
        opts: RelocateOptions,
        progress: &dyn Fn(Progress),
    ) -> Result<RelocateReport, RelocateError> {
        let _one = self.busy.try_lock().ok_or(RelocateError::Busy)?;
        self.cancel.store(false, Ordering::Release);
        let total = self.state.read().current.info().pages;
        let target_pages = target.info().pages;
        if target_pages < total {
            return Err(RelocateError::TooSmall { target: target_pages, needed: total });
        }
        let moving =
            Arc::new(Moving { target, cursor: AtomicU64::new(0), failed: Mutex::new(None) });
        self.state.write().moving = Some(Arc::clone(&moving));
        let result = self.copy_all(&moving, total, opts, progress);
        let mut st = self.state.write();
        st.moving = None;
        result?;
        // A mirrored write that failed after the last batch.
        if let Some((page, source)) = moving.failed.lock().take() {
            return Err(RelocateError::Store { page, source });
        }
        let old = std::mem::replace(&mut st.current, Arc::clone(&moving.target));
        Ok(RelocateReport { pages_copied: total, old })
    }

    fn copy_all(
        &self,
        m: &Moving,
        total: u64,
        opts: RelocateOptions,
        progress: &dyn Fn(Progress),
    ) -> Result<(), RelocateError> {
        let batch = opts.batch_pages.clamp(1, BATCH_PAGES_MAX);
        let mut buf = vec![0u8; batch as usize * PAGE_SIZE];
        let mut page = 0;
        while page < total {
            if opts.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RelocateError::DeadlineExceeded { copied: page, total });
            }
            if self.cancel.load(Ordering::Acquire) {
                return Err(RelocateError::Cancelled { copied: page, total });
            }
            if let Some((page, source)) = m.failed.lock().take() {
                return Err(RelocateError::Store { page, source });
            }
            let n = batch.min(total - page);
            self.copy_batch(m, page, n, &mut buf[..n as usize * PAGE_SIZE])?;
            page += n;
            progress(Progress { pages_copied: page, pages_total: total });
        }
        Ok(())
    }

    fn copy_batch(
        &self,
        m: &Moving,
        page: u64,
        n: u64,
        buf: &mut [u8],
    ) -> Result<(), RelocateError> {
        let st = self.state.read();
        let _pages = self.locks.write(&LockSet::of_run(page, n));
        let err = |source| RelocateError::Store { page, source };
        st.current.read(&mut [ReadOp { page, buf: &mut *buf }]).map_err(err)?;
        m.target.write(&[WriteOp { page, data: buf }]).map_err(err)?;
        m.cursor.store(page + n, Ordering::Release);
        Ok(())
    }
}

/// Runs of `ops` that lie below the cursor (the part already copied).
fn copied_part(page: u64, count: u64, cursor: u64) -> Option<(u64, u64)> {
    (page < cursor).then(|| (page, count.min(cursor - page)))
}

impl PageStore for Relocatable {
    fn info(&self) -> StoreInfo {
        let inner = self.state.read().current.info();
        // Not `checked`: the pages may move to a store that is not.
        let caps = crate::Caps { checked: false, ..inner.caps };
        StoreInfo { name: format!("relocatable({})", inner.name), caps, ..inner }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.state.read().current.read(ops)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let st = self.state.read();
        let Some(m) = &st.moving else { return st.current.write(ops) };
        let mut set = LockSet::new();
        for op in ops {
            set.add_run(op.page, (op.data.len() / PAGE_SIZE) as u64);
        }
        let _pages = self.locks.write(&set);
        st.current.write(ops)?;
        let cursor = m.cursor.load(Ordering::Acquire);
        let copied: Vec<WriteOp> = ops
            .iter()
            .filter_map(|op| {
                let (page, n) = copied_part(op.page, (op.data.len() / PAGE_SIZE) as u64, cursor)?;
                Some(WriteOp { page, data: &op.data[..n as usize * PAGE_SIZE] })
            })
            .collect();
        if !copied.is_empty() {
            m.mirror(copied[0].page, m.target.write(&copied));
        }
        Ok(())
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        let st = self.state.read();
        let Some(m) = &st.moving else { return st.current.discard(page, count) };
        let _pages = self.locks.write(&LockSet::of_run(page, count));
        st.current.discard(page, count)?;
        if let Some((p, n)) = copied_part(page, count, m.cursor.load(Ordering::Acquire)) {
            m.mirror(p, m.target.discard(p, n));
        }
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        let st = self.state.read();
        st.current.flush()?;
        if let Some(m) = &st.moving {
            m.mirror(0, m.target.flush());
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "relocate_tests.rs"]
mod tests;
