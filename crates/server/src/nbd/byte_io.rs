//! Byte-granular I/O on a page store. NBD offsets and lengths are in bytes;
//! the store speaks whole 4 KiB pages. A range is cut into a partial head
//! page, whole middle pages and a partial tail page. Whole pages go to the
//! store directly from the client's buffer; partial ones are read, patched
//! and written back under the export's stripe lock, so two sub-page writes
//! to different bytes of one page (from any connections) never lose either.
//!
//! Callers have checked that the range lies inside the export.

use super::export::ExportState;
use memlend_store::{ReadOp, StoreResult, WriteOp, PAGE_SIZE};

const PS: u64 = PAGE_SIZE as u64;
/// A page-aligned run of zeroes, written repeatedly for WRITE_ZEROES with
/// NO_HOLE. Static, so it costs no allocation per request.
static ZEROES: [u8; ZERO_RUN_BYTES] = [0; ZERO_RUN_BYTES];
const ZERO_RUN_BYTES: usize = 64 * PAGE_SIZE;
/// Zero runs handed to the store in one call (4 MiB).
const ZERO_RUNS_PER_CALL: usize = 16;

/// Part of one page: bytes `at..at + len` of `page`, which are bytes
/// `buf_at..buf_at + len` of the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Partial {
    page: u64,
    at: usize,
    len: usize,
    buf_at: usize,
}

/// A byte range cut at page boundaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    head: Option<Partial>,
    /// First whole page, count, and where it starts in the request's buffer.
    whole: Option<(u64, u64, usize)>,
    tail: Option<Partial>,
}

fn split(offset: u64, len: u64) -> Span {
    let end = offset + len;
    let mut pos = offset;
    let mut span = Span::default();
    if len > 0 && (!pos.is_multiple_of(PS) || end - pos < PS) {
        let at = pos % PS;
        let n = (PS - at).min(end - pos);
        span.head = Some(Partial { page: pos / PS, at: at as usize, len: n as usize, buf_at: 0 });
        pos += n;
    }
    let count = (end - pos) / PS;
    if count > 0 {
        span.whole = Some((pos / PS, count, (pos - offset) as usize));
        pos += count * PS;
    }
    if pos < end {
        let (len, buf_at) = ((end - pos) as usize, (pos - offset) as usize);
        span.tail = Some(Partial { page: pos / PS, at: 0, len, buf_at });
    }
    span
}

impl ExportState {
    /// Fill `buf` with the export's bytes at `offset`, in one store call.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> StoreResult<()> {
        let span = split(offset, buf.len() as u64);
        if let (None, Some((page, _, _)), None) = (span.head, span.whole, span.tail) {
            return self.store.read(&mut [ReadOp { page, buf }]);
        }
        let mut head_page = [0u8; PAGE_SIZE];
        let mut tail_page = [0u8; PAGE_SIZE];
        let mut ops = Vec::with_capacity(3);
        if let Some(h) = span.head {
            ops.push(ReadOp { page: h.page, buf: &mut head_page });
        }
        let (whole_buf_at, whole_bytes) =
            span.whole.map_or((0, 0), |(_, n, at)| (at, n as usize * PAGE_SIZE));
        let (_, rest) = buf.split_at_mut(whole_buf_at);
        if let Some((page, _, _)) = span.whole {
            ops.push(ReadOp { page, buf: &mut rest[..whole_bytes] });
        }
        if let Some(t) = span.tail {
            ops.push(ReadOp { page: t.page, buf: &mut tail_page });
        }
        self.store.read(&mut ops)?;
        drop(ops);
        for (part, page) in [(span.head, &head_page), (span.tail, &tail_page)] {
            if let Some(p) = part {
                buf[p.buf_at..p.buf_at + p.len].copy_from_slice(&page[p.at..p.at + p.len]);
            }
        }
        Ok(())
    }

    /// Write `data` at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> StoreResult<()> {
        let span = split(offset, data.len() as u64);
        if let Some((page, count, at)) = span.whole {
            let data = &data[at..at + count as usize * PAGE_SIZE];
            self.store.write(&[WriteOp { page, data }])?;
        }
        for p in [span.head, span.tail].into_iter().flatten() {
            let src = &data[p.buf_at..p.buf_at + p.len];
            self.patch_page(p, |bytes| bytes.copy_from_slice(src))?;
        }
        Ok(())
    }

    /// Make `len` bytes at `offset` read as zero. Whole pages are discarded
    /// when `may_trim`, else written with zeroes (NO_HOLE: keep them
    /// allocated).
    pub fn zero_at(&self, offset: u64, len: u64, may_trim: bool) -> StoreResult<()> {
        let span = split(offset, len);
        if let Some((page, count, _)) = span.whole {
            if may_trim {
                self.store.discard(page, count)?;
            } else {
                self.write_zero_pages(page, count)?;
            }
        }
        for p in [span.head, span.tail].into_iter().flatten() {
            self.patch_page(p, |bytes| bytes.fill(0))?;
        }
        Ok(())
    }

    /// Discard the whole pages inside the range. TRIM is a hint: partial
    /// pages at the edges keep their bytes, as the protocol allows.
    pub fn trim_at(&self, offset: u64, len: u64) -> StoreResult<()> {
        match split(offset, len).whole {
            Some((page, count, _)) => self.store.discard(page, count),
            None => Ok(()),
        }
    }

    /// Read-modify-write of part of one page, under its stripe lock.
    fn patch_page(&self, p: Partial, patch: impl FnOnce(&mut [u8])) -> StoreResult<()> {
        let mut page = [0u8; PAGE_SIZE];
        let _guard = self.lock_page(p.page);
        self.store.read(&mut [ReadOp { page: p.page, buf: &mut page }])?;
        patch(&mut page[p.at..p.at + p.len]);
        self.store.write(&[WriteOp { page: p.page, data: &page }])
    }

    /// Write zero pages over `page..page + count`, 4 MiB per store call.
    fn write_zero_pages(&self, page: u64, count: u64) -> StoreResult<()> {
        let run_pages = (ZERO_RUN_BYTES / PAGE_SIZE) as u64;
        let mut next = page;
        let end = page + count;
        while next < end {
            let mut ops = Vec::with_capacity(ZERO_RUNS_PER_CALL);
            while next < end && ops.len() < ZERO_RUNS_PER_CALL {
                let n = run_pages.min(end - next);
                ops.push(WriteOp { page: next, data: &ZEROES[..n as usize * PAGE_SIZE] });
                next += n;
            }
            self.store.write(&ops)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::export::Export;
    use memlend_store::ram::{RamOptions, RamStore};
    use proptest::prelude::*;
    use std::sync::Arc;

    const PAGES: u64 = 8;

    fn export() -> ExportState {
        let store = Arc::new(RamStore::new(PAGES, RamOptions::default()).unwrap());
        ExportState::new(Export::new("t", store)).unwrap()
    }

    fn ranges() -> impl Strategy<Value = (u64, u64)> {
        let size = PAGES * PS;
        (0..size).prop_flat_map(move |o| (Just(o), 0..=(size - o)))
    }

    #[test]
    fn split_cuts_at_page_boundaries() {
        let s = split(100, 8000);
        assert_eq!(s.head, Some(Partial { page: 0, at: 100, len: 3996, buf_at: 0 }));
        assert_eq!(s.whole, None);
        assert_eq!(s.tail, Some(Partial { page: 1, at: 0, len: 4004, buf_at: 3996 }));
        assert_eq!(split(4096, 8192), Span { whole: Some((1, 2, 0)), ..Default::default() });
        assert_eq!(split(0, 0), Span::default());
        let s = split(10, 20);
        assert_eq!((s.head.unwrap().len, s.whole, s.tail), (20, None, None));
    }

    proptest! {
        /// Against a plain byte array as the model: writes, zeroes and reads
        /// at any offset agree with it.
        #[test]
        fn byte_io_matches_a_flat_model(
            ops in proptest::collection::vec((ranges(), any::<u8>(), 0u8..3), 1..12)
        ) {
            let e = export();
            let mut model = vec![0u8; (PAGES * PS) as usize];
            for ((offset, len), byte, kind) in ops {
                let r = offset as usize..(offset + len) as usize;
                match kind {
                    0 => {
                        let data = vec![byte; len as usize];
                        e.write_at(offset, &data).unwrap();
                        model[r.clone()].copy_from_slice(&data);
                    }
                    1 => {
                        e.zero_at(offset, len, byte % 2 == 0).unwrap();
                        model[r.clone()].fill(0);
                    }
                    _ => {}
                }
                let mut got = vec![0xeeu8; len as usize];
                e.read_at(offset, &mut got).unwrap();
                prop_assert_eq!(&got[..], &model[r]);
            }
            let mut all = vec![0u8; model.len()];
            e.read_at(0, &mut all).unwrap();
            prop_assert!(all == model);
        }
    }

    #[test]
    fn trim_keeps_partial_edges_and_zeroes_whole_pages() {
        let e = export();
        e.write_at(0, &vec![7u8; 3 * PAGE_SIZE]).unwrap();
        e.trim_at(100, 2 * PS).unwrap();
        let mut got = vec![0u8; 3 * PAGE_SIZE];
        e.read_at(0, &mut got).unwrap();
        assert!(got[..PAGE_SIZE].iter().all(|&b| b == 7));
        assert!(got[PAGE_SIZE..2 * PAGE_SIZE].iter().all(|&b| b == 0));
        assert!(got[2 * PAGE_SIZE..].iter().all(|&b| b == 7));
    }

    #[test]
    fn no_hole_zeroes_span_many_store_calls() {
        let store = Arc::new(RamStore::new(4096, RamOptions::default()).unwrap());
        let e = ExportState::new(Export::new("t", store)).unwrap();
        e.write_at(0, &vec![1u8; 4096 * PAGE_SIZE]).unwrap();
        e.zero_at(1, 4096 * PS - 2, false).unwrap();
        let mut got = vec![0u8; 4096 * PAGE_SIZE];
        e.read_at(0, &mut got).unwrap();
        assert_eq!((got[0], got[got.len() - 1]), (1, 1));
        assert!(got[1..got.len() - 1].iter().all(|&b| b == 0));
    }
}
