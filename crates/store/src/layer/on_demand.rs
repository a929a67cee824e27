//! `on_demand`: a store that does not exist until its first write. Until
//! then it reads as zeros (nothing was written) and discards are no-ops; the
//! first write calls `open` for the real store and waits for it, and every
//! operation after goes to that store. Whoever builds the stack decides what
//! `open` does (lease a segment from the cluster, create a file); the data
//! path above only sees a `PageStore`.
//!
//! `info().pages` is always the size given, whatever the real store holds,
//! so the offsets of stores concatenated after this one never move.

use crate::WriteOp;
use crate::{check_range, check_run, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Makes the real store, or says why it cannot.
pub type Open = Box<dyn Fn() -> Result<Arc<dyn PageStore>, String> + Send + Sync>;

pub struct OnDemand {
    pages: u64,
    /// What the store will look like (its caps), for `info` before it exists.
    like: StoreInfo,
    /// For errors and the name before it exists: "segment 3".
    what: String,
    open: Open,
    /// After `open` failed, writes fail at once for this long instead of
    /// calling it again for every batch.
    retry: Duration,
    inner: RwLock<Option<Arc<dyn PageStore>>>,
    /// One `open` at a time; holds until when the last one was refused.
    opening: Mutex<Option<Instant>>,
}

impl OnDemand {
    pub fn new(pages: u64, like: StoreInfo, what: String, retry: Duration, open: Open) -> Self {
        let (inner, opening) = (RwLock::new(None), Mutex::new(None));
        OnDemand { pages, like, what, open, retry, inner, opening }
    }

    fn current(&self) -> Option<Arc<dyn PageStore>> {
        self.inner.read().clone()
    }

    /// The real store, opened now if it is not yet.
    fn opened(&self) -> StoreResult<Arc<dyn PageStore>> {
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let mut refused = self.opening.lock();
        if let Some(s) = self.current() {
            return Ok(s);
        }
        if refused.is_some_and(|until| Instant::now() < until) {
            return Err(StoreError::NoSpace(format!(
                "{} has no store yet (refused less than {} ms ago)",
                self.what,
                self.retry.as_millis()
            )));
        }
        match (self.open)() {
            Ok(s) => {
                *self.inner.write() = Some(Arc::clone(&s));
                Ok(s)
            }
            Err(why) => {
                *refused = Some(Instant::now() + self.retry);
                Err(StoreError::NoSpace(format!("{}: {why}", self.what)))
            }
        }
    }
}

impl PageStore for OnDemand {
    fn info(&self) -> StoreInfo {
        let pages = self.pages;
        match self.current() {
            Some(s) => StoreInfo { pages, ..s.info() },
            None => {
                StoreInfo { pages, name: format!("on_demand({})", self.what), ..self.like.clone() }
            }
        }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        match self.current() {
            Some(s) => s.read(ops),
            None => {
                for op in ops.iter_mut() {
                    check_run(self.pages, op.page, op.buf.len())?;
                    op.buf.fill(0);
                }
                Ok(())
            }
        }
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        self.opened()?.write(ops)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        match self.current() {
            Some(s) => s.discard(page, count),
            None => check_range(self.pages, page, count),
        }
    }

    fn flush(&self) -> StoreResult<()> {
        self.current().map_or(Ok(()), |s| s.flush())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};
    use crate::PAGE_SIZE;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    fn on_demand(pages: u64, opens: Arc<AtomicU64>, refuse: Arc<AtomicU64>) -> OnDemand {
        let like = RamStore::new(1, RamOptions::default()).unwrap().info();
        let open: Open = Box::new(move || {
            opens.fetch_add(1, SeqCst);
            match refuse.load(SeqCst) {
                0 => Ok(Arc::new(RamStore::new(pages, RamOptions::default()).unwrap()) as _),
                _ => Err("no room".into()),
            }
        });
        OnDemand::new(pages, like, "segment 3".into(), Duration::from_millis(200), open)
    }

    #[test]
    fn reads_zeros_until_written_then_opens_once_and_refusals_wait_their_turn() {
        let (opens, refuse) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(1)));
        let s = on_demand(16, Arc::clone(&opens), Arc::clone(&refuse));
        let mut buf = vec![7u8; PAGE_SIZE];
        s.read(&mut [ReadOp { page: 3, buf: &mut buf }]).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        s.discard(0, 16).unwrap();
        assert_eq!((opens.load(SeqCst), s.info().pages), (0, 16));
        let page = vec![9u8; PAGE_SIZE];
        let e = s.write(&[WriteOp { page: 1, data: &page }]).unwrap_err();
        assert!(e.to_string().contains("segment 3: no room"), "{e}");
        let e = s.write(&[WriteOp { page: 1, data: &page }]).unwrap_err();
        assert!(e.to_string().contains("no store yet"), "{e}");
        assert_eq!(opens.load(SeqCst), 1, "a refusal holds for the retry interval");
        refuse.store(0, SeqCst);
        std::thread::sleep(Duration::from_millis(250));
        std::thread::scope(|t| {
            for _ in 0..4 {
                t.spawn(|| s.write(&[WriteOp { page: 1, data: &page }]).unwrap());
            }
        });
        assert_eq!(opens.load(SeqCst), 2, "writers at once open it once");
        s.read(&mut [ReadOp { page: 1, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page);
        assert!(s.write(&[WriteOp { page: 16, data: &page }]).is_err(), "past the end");
    }
}
