//! `lost`: what a store becomes when its only copy of the pages is gone (a
//! lease revoked or its donor dead, with no second home). The old pages
//! cannot come back, so a read of one fails at once with the reason: the
//! fault handler then raises SIGBUS at that page instead of asking a dead
//! donor again and again. Pages written (or discarded) since the loss live
//! in a fresh home store and read back from it, so eviction keeps working
//! and the program's newer data is safe.

use super::table::Bitmap;
use crate::{PageStore, ReadOp, StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::Arc;

pub struct Lost {
    home: Arc<dyn PageStore>,
    /// Pages written or discarded since the loss: those are on `home`.
    renewed: Bitmap,
    pages: u64,
    why: String,
}

impl Lost {
    /// `pages` were lost for `why`; `home` (at least as large) takes new
    /// writes.
    pub fn new(home: Arc<dyn PageStore>, pages: u64, why: &str) -> StoreResult<Lost> {
        let have = home.info().pages;
        if have < pages {
            return Err(StoreError::NoSpace(format!("home has {have} pages, {pages} needed")));
        }
        let renewed = Bitmap::new(pages, "renewed bits")?;
        Ok(Lost { home, renewed, pages, why: why.to_string() })
    }

    fn check(&self, page: u64, count: u64) -> StoreResult<()> {
        match page.checked_add(count) {
            Some(end) if end <= self.pages => Ok(()),
            _ => Err(StoreError::OutOfRange { page, count, pages: self.pages }),
        }
    }

    fn renew(&self, page: u64, count: u64) {
        (page..page + count).for_each(|p| self.renewed.set(p));
    }
}

impl PageStore for Lost {
    fn info(&self) -> StoreInfo {
        let inner = self.home.info();
        StoreInfo { pages: self.pages, caps: inner.caps, name: format!("lost({})", inner.name) }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            let count = (op.buf.len() / PAGE_SIZE) as u64;
            self.check(op.page, count)?;
            if let Some(p) = (op.page..op.page + count).find(|&p| !self.renewed.get(p)) {
                return Err(StoreError::Unavailable(format!("page {p} was lost: {}", self.why)));
            }
        }
        self.home.read(ops)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            self.check(op.page, (op.data.len() / PAGE_SIZE) as u64)?;
        }
        self.home.write(ops)?;
        // Only now: a read that sees the bit finds the data at home.
        ops.iter().for_each(|op| self.renew(op.page, (op.data.len() / PAGE_SIZE) as u64));
        Ok(())
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.check(page, count)?;
        self.home.discard(page, count)?;
        self.renew(page, count); // a discarded page reads as zeroes from home
        Ok(())
    }

    fn flush(&self) -> StoreResult<()> {
        self.home.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};

    fn lost(pages: u64) -> Lost {
        let home = Arc::new(RamStore::new(pages, RamOptions::default()).unwrap());
        Lost::new(home, pages, "lease 7 revoked by donor n1").unwrap()
    }

    fn read(s: &Lost, page: u64, count: usize) -> StoreResult<Vec<u8>> {
        let mut buf = vec![0u8; count * PAGE_SIZE];
        s.read(&mut [ReadOp { page, buf: &mut buf }])?;
        Ok(buf)
    }

    #[test]
    fn old_pages_fail_at_once_with_the_reason_and_new_ones_read_back() {
        let s = lost(16);
        let err = read(&s, 3, 1).unwrap_err().to_string();
        assert!(err.contains("page 3 was lost") && err.contains("revoked by donor n1"), "{err}");
        let data = vec![0xab; 2 * PAGE_SIZE];
        s.write(&[WriteOp { page: 4, data: &data }]).unwrap();
        assert_eq!(read(&s, 4, 2).unwrap(), data);
        // A run that is only partly renewed is still lost.
        assert!(read(&s, 4, 3).unwrap_err().to_string().contains("page 6 was lost"));
        s.discard(6, 1).unwrap();
        assert_eq!(read(&s, 6, 1).unwrap(), vec![0; PAGE_SIZE]);
        assert!(matches!(read(&s, 15, 2), Err(StoreError::OutOfRange { .. })));
        assert!(s.info().name.starts_with("lost("));
    }

    #[test]
    fn a_home_too_small_is_refused() {
        let home = Arc::new(RamStore::new(4, RamOptions::default()).unwrap());
        assert!(matches!(Lost::new(home, 8, "x"), Err(StoreError::NoSpace(_))));
    }
}
