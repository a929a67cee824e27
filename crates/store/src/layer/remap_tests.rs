//! Tests shared by the layers that keep pages elsewhere below (`append`,
//! `pack`): a store below whose reads are slow, and writers rewriting
//! pages while readers read them.

use crate::ram::RamStore;
use crate::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

/// Reads that take a while after their lookup: the window in which a
/// place below reused too soon would be rewritten under them.
pub(crate) struct SlowReads(pub RamStore);

impl PageStore for SlowReads {
    fn info(&self) -> StoreInfo {
        self.0.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        std::thread::sleep(std::time::Duration::from_micros(50));
        self.0.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.0.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.0.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        Ok(())
    }
}

/// How a race names and makes its pages: `tag(page, version)`, the page a
/// tag belongs to, and the bytes of a tag (which start with the tag).
pub(crate) struct Versions {
    pub tag: fn(u64, u64) -> u64,
    pub page_of_tag: fn(u64) -> u64,
    pub bytes: fn(u64) -> Vec<u8>,
}

/// Two writers rewrite their own halves of 64 pages while two readers read
/// everyone's: a read returns one whole version of that very page, never
/// a page whose place below was reused under it.
pub(crate) fn reads_racing_rewrites_get_whole_pages(s: Arc<dyn PageStore>, v: Versions) {
    let pages = 64u64;
    let stop = Arc::new(AtomicBool::new(false));
    for page in 0..pages {
        s.write(&[WriteOp { page, data: &(v.bytes)((v.tag)(page, 0)) }]).unwrap();
    }
    let mut threads = Vec::new();
    for w in 0..2u64 {
        let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut version = 1;
            while !stop.load(SeqCst) {
                let batch: Vec<(u64, Vec<u8>)> = (0..8)
                    .map(|i| w * 32 + (version * 5 + i) % 32)
                    .map(|p| (p, (v.bytes)((v.tag)(p, version))))
                    .collect();
                let ops: Vec<WriteOp<'_>> =
                    batch.iter().map(|(p, d)| WriteOp { page: *p, data: d }).collect();
                s.write(&ops).unwrap();
                version += 1;
            }
        }));
    }
    for r in 0..2u64 {
        let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            // The writers stop when the readers do, a failed assertion too.
            struct StopOnDrop(Arc<AtomicBool>);
            impl Drop for StopOnDrop {
                fn drop(&mut self) {
                    self.0.store(true, SeqCst);
                }
            }
            let _stop = StopOnDrop(stop);
            for i in 0..1_000u64 {
                let page = (i * 7 + r) % pages;
                let mut got = vec![0xAAu8; PAGE_SIZE];
                s.read(&mut [ReadOp { page, buf: &mut got }]).unwrap();
                let first = u64::from_le_bytes(got[..8].try_into().unwrap());
                assert_eq!((v.page_of_tag)(first), page, "page {page} read another page's bytes");
                assert_eq!(got, (v.bytes)(first), "page {page} torn");
            }
        }));
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
}

/// 20 K random writes (runs of 1-12 pages), reads and discards on a store
/// of `pages` pages against a model: every read returns the page last
/// written there, or zeroes.
pub(crate) fn random_operations_match_a_model(s: &dyn PageStore, bytes: fn(u64) -> Vec<u8>) {
    let pages = s.info().pages;
    let read_one = |page: u64| {
        let mut buf = vec![0xAAu8; PAGE_SIZE];
        s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
        buf
    };
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..20_000u64 {
        let page = next() % pages;
        match next() % 10 {
            0 => {
                let count = (next() % 8).min(pages - page);
                s.discard(page, count).unwrap();
                for p in page..page + count {
                    model.remove(&p);
                }
            }
            1..=5 => {
                let count = 1 + (next() % 12).min(pages - page - 1);
                let data: Vec<u8> = (0..count).flat_map(|i| bytes(step << 8 | i)).collect();
                s.write(&[WriteOp { page, data: &data }]).unwrap();
                for i in 0..count {
                    model.insert(page + i, step << 8 | i);
                }
            }
            _ => {
                let want = model.get(&page).map_or(vec![0; PAGE_SIZE], |&t| bytes(t));
                assert_eq!(read_one(page), want, "page {page} at step {step}");
            }
        }
    }
    for page in 0..pages {
        let want = model.get(&page).map_or(vec![0; PAGE_SIZE], |&t| bytes(t));
        assert_eq!(read_one(page), want, "page {page} at the end");
    }
}
