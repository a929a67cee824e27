//! A store whose writes take 5 ms each, like a donor far away: eviction
//! batches grow (each write costs the same whatever its size), and every
//! byte still reads back.

use memlend_fault::{Region, RegionConfig};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::Arc;
use std::time::Duration;

struct Slow(RamStore);

impl PageStore for Slow {
    fn info(&self) -> StoreInfo {
        self.0.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.0.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        std::thread::sleep(Duration::from_millis(5));
        self.0.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.0.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.0.flush()
    }
}

#[test]
fn a_slow_store_gets_bigger_batches_and_loses_nothing() {
    const PAGES: usize = 16384;
    let store = Arc::new(Slow(RamStore::new(PAGES as u64, RamOptions::default()).unwrap()));
    let config =
        RegionConfig { size_bytes: PAGES * PAGE_SIZE, budget_pages: 2048, evict_batch_pages: 32 };
    let region = Region::new(config, store).unwrap();
    // SAFETY: the region is a live, writable mapping of `len()` bytes while
    // `region` is borrowed, and only this thread touches it.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    for pass in 0..2u8 {
        for (page, chunk) in mem.chunks_mut(PAGE_SIZE).enumerate() {
            chunk[..8].copy_from_slice(&(page as u64 ^ u64::from(pass) << 60).to_le_bytes());
            chunk[8] = pass;
        }
        for (page, chunk) in mem.chunks(PAGE_SIZE).enumerate() {
            let want = page as u64 ^ u64::from(pass) << 60;
            assert_eq!(chunk[..8], want.to_le_bytes(), "pass {pass} page {page}");
            assert_eq!(chunk[8], pass);
        }
    }
    let s = region.stats();
    // At 32 pages a batch, 2 passes of 16384 pages need about 1000 writes;
    // batches that grow to 256 (an eighth of the budget) need far fewer.
    let pages_per_batch = s.pages_written_back / s.eviction_batches.max(1);
    assert!(pages_per_batch >= 80, "{pages_per_batch} pages per batch: {s:?}");
    assert!(s.pages_resident as usize <= 2048, "{s:?}");
}
