//! `local_tags`: a sidecar kept in this process for a store that has none
//! (a file, RAM), so that `crypt` runs over any store. Donors keep the
//! sidecar themselves (`remote`), which is what keeps a borrower's own
//! metadata small; this layer costs [`SIDECAR_LEN`] bytes a page here.

use super::table::{self, ZeroValid};
use crate::{batch_pages, PageStore, ReadOp, Sidecar, SidecarStore, StoreError, StoreInfo};
use crate::{InPlace, StoreResult, WriteOp, PAGE_SIZE, SIDECAR_LEN};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct LocalTags<S> {
    inner: S,
    side: Box<[Slot]>,
}

/// One page's sidecar as two little-endian halves. Callers order writers
/// and readers of a page (see [`SidecarStore`]), so relaxed is enough.
struct Slot([AtomicU64; 2]);

// SAFETY: two AtomicU64; all-zero bytes are two zeroes.
unsafe impl ZeroValid for Slot {}

impl<S: PageStore> LocalTags<S> {
    pub fn new(inner: S) -> StoreResult<Self> {
        let side = table::zeroed(inner.info().pages, "sidecars")?;
        Ok(LocalTags { inner, side })
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Bytes of sidecar this layer holds.
    pub fn metadata_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.side)
    }

    fn pages_of<'a>(
        runs: impl Iterator<Item = (u64, usize)> + 'a,
    ) -> impl Iterator<Item = u64> + 'a {
        runs.flat_map(|(page, len)| (0..(len / PAGE_SIZE) as u64).map(move |i| page + i))
    }

    fn check_side(pages: usize, side: usize) -> StoreResult<()> {
        if pages != side {
            return Err(StoreError::Misaligned { len_bytes: side * SIDECAR_LEN });
        }
        Ok(())
    }
}

impl Slot {
    fn load(&self) -> Sidecar {
        let mut out = [0u8; SIDECAR_LEN];
        out[..8].copy_from_slice(&self.0[0].load(Relaxed).to_le_bytes());
        out[8..].copy_from_slice(&self.0[1].load(Relaxed).to_le_bytes());
        out
    }

    fn store(&self, side: &Sidecar) {
        let (low, high) = side.split_at(8);
        self.0[0].store(u64::from_le_bytes(low.try_into().expect("8 bytes")), Relaxed);
        self.0[1].store(u64::from_le_bytes(high.try_into().expect("8 bytes")), Relaxed);
    }

    /// Back to all zeroes, leaving a slot never written untouched (so the
    /// table's memory stays unallocated).
    fn clear(&self) {
        if self.0[0].load(Relaxed) != 0 || self.0[1].load(Relaxed) != 0 {
            self.store(&[0; SIDECAR_LEN]);
        }
    }
}

impl<S: PageStore> SidecarStore for LocalTags<S> {
    fn read_with(&self, ops: &mut [ReadOp<'_>], side: &mut [Sidecar]) -> StoreResult<()> {
        Self::check_side(batch_pages(ops.iter().map(|op| op.buf.len())), side.len())?;
        self.inner.read(ops)?;
        let pages = Self::pages_of(ops.iter().map(|op| (op.page, op.buf.len())));
        for (page, out) in pages.zip(side.iter_mut()) {
            *out = self.side[page as usize].load();
        }
        Ok(())
    }

    fn write_with(&self, ops: &[WriteOp<'_>], side: &[Sidecar]) -> StoreResult<()> {
        Self::check_side(batch_pages(ops.iter().map(|op| op.data.len())), side.len())?;
        for op in ops {
            crate::check_run(self.side.len() as u64, op.page, op.data.len())?;
        }
        let pages = Self::pages_of(ops.iter().map(|op| (op.page, op.data.len())));
        for (page, s) in pages.zip(side) {
            self.side[page as usize].store(s);
        }
        self.inner.write(ops)
    }

    fn read_tags_in_place(&self, page: u64, side: &mut [Sidecar]) -> Option<StoreResult<InPlace>> {
        let mem = match self.inner.in_place(page, side.len() as u64)? {
            Ok(mem) => mem,
            Err(e) => return Some(Err(e)),
        };
        for (slot, out) in self.side[page as usize..].iter().zip(side.iter_mut()) {
            *out = slot.load();
        }
        Some(Ok(mem))
    }
}

impl<S: PageStore> PageStore for LocalTags<S> {
    fn info(&self) -> StoreInfo {
        let inner = self.inner.info();
        StoreInfo { name: format!("local_tags({})", inner.name), ..inner }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            crate::check_run(self.side.len() as u64, op.page, op.data.len())?;
        }
        let pages = Self::pages_of(ops.iter().map(|op| (op.page, op.data.len())));
        pages.for_each(|page| self.side[page as usize].clear());
        self.inner.write(ops)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        crate::check_range(self.side.len() as u64, page, count)?;
        (page..page + count).for_each(|p| self.side[p as usize].clear());
        self.inner.discard(page, count)
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};

    fn store(pages: u64) -> LocalTags<RamStore> {
        LocalTags::new(RamStore::new(pages, RamOptions::default()).unwrap()).unwrap()
    }

    fn read_side(s: &LocalTags<RamStore>, page: u64) -> (Vec<u8>, Sidecar) {
        let (mut buf, mut side) = (vec![0u8; PAGE_SIZE], [[0xee; SIDECAR_LEN]]);
        s.read_with(&mut [ReadOp { page, buf: &mut buf }], &mut side).unwrap();
        (buf, side[0])
    }

    #[test]
    fn sidecars_follow_their_pages_and_clear_with_them() {
        let s = store(8);
        let data = [[1u8; PAGE_SIZE], [2u8; PAGE_SIZE]].concat();
        s.write_with(&[WriteOp { page: 3, data: &data }], &[[7; 16], [8; 16]]).unwrap();
        assert_eq!(read_side(&s, 3), (vec![1u8; PAGE_SIZE], [7; 16]));
        assert_eq!(read_side(&s, 4), (vec![2u8; PAGE_SIZE], [8; 16]));
        assert_eq!(read_side(&s, 5).1, [0; 16], "never written");
        s.write(&[WriteOp { page: 3, data: &[3u8; PAGE_SIZE] }]).unwrap();
        assert_eq!(read_side(&s, 3).1, [0; 16], "a plain write leaves no stale sidecar");
        s.discard(4, 1).unwrap();
        assert_eq!(read_side(&s, 4), (vec![0u8; PAGE_SIZE], [0; 16]));
        assert_eq!(s.metadata_bytes(), 8 * SIDECAR_LEN);
    }

    #[test]
    fn a_sidecar_count_that_does_not_match_the_pages_is_refused() {
        let s = store(8);
        let data = [1u8; 2 * PAGE_SIZE];
        let err = s.write_with(&[WriteOp { page: 0, data: &data }], &[[7; 16]]).unwrap_err();
        assert!(matches!(err, StoreError::Misaligned { .. }), "{err}");
        assert_eq!(read_side(&s, 0), (vec![0u8; PAGE_SIZE], [0; 16]), "nothing written");
        let err = s.write_with(&[WriteOp { page: 7, data: &data }], &[[7; 16]; 2]).unwrap_err();
        assert!(matches!(err, StoreError::OutOfRange { .. }), "{err}");
    }
}
