use super::*;
use crate::layer::flaky::Flaky;
use crate::layer::remap_tests::*;
use crate::ram::{RamOptions, RamStore};
use std::sync::atomic::Ordering::SeqCst;

fn ram(pages: u64) -> RamStore {
    RamStore::new(pages, RamOptions::default()).unwrap()
}

fn page_of(tag: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    for (i, w) in p.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(tag ^ (i as u64).rotate_left(17)).to_le_bytes());
    }
    p
}

fn read_one(s: &impl PageStore, page: u64) -> Vec<u8> {
    let mut buf = vec![0xAAu8; PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
    buf
}

/// Records the runs of every write that reaches it.
struct Runs {
    inner: RamStore,
    runs: Mutex<Vec<u64>>,
}

impl PageStore for Runs {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let mut runs = 1;
        for w in ops.windows(2) {
            runs += u64::from(w[1].page != w[0].page + (w[0].data.len() / PAGE_SIZE) as u64);
        }
        self.runs.lock().push(runs);
        self.inner.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.inner.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        Ok(())
    }
}

#[test]
fn pages_read_back_what_was_written_last_and_zero_before_and_after_discard() {
    let s = Append::new(ram(slots_for(64)), 64).unwrap();
    assert_eq!(s.info().pages, 64);
    assert_eq!(read_one(&s, 5), vec![0; PAGE_SIZE]);
    let two = [page_of(1), page_of(2)].concat();
    s.write(&[WriteOp { page: 5, data: &two }]).unwrap();
    s.write(&[WriteOp { page: 6, data: &page_of(3) }]).unwrap();
    assert_eq!(read_one(&s, 5), page_of(1));
    assert_eq!(read_one(&s, 6), page_of(3));
    let mut both = vec![0u8; 2 * PAGE_SIZE];
    s.read(&mut [ReadOp { page: 5, buf: &mut both }]).unwrap();
    assert_eq!(both, [page_of(1), page_of(3)].concat());
    s.discard(5, 1).unwrap();
    assert_eq!(read_one(&s, 5), vec![0; PAGE_SIZE]);
    assert_eq!(read_one(&s, 6), page_of(3));
}

#[test]
fn scattered_pages_go_down_as_whole_chunks() {
    let pages = 4096;
    let below = Arc::new(Runs { inner: ram(slots_for(pages)), runs: Mutex::new(Vec::new()) });
    let s = Append::new(Arc::clone(&below), pages).unwrap();
    let data = page_of(9);
    // 64 pages 61 apart: 64 runs on a plain store.
    let ops: Vec<WriteOp<'_>> =
        (0..64).map(|i| WriteOp { page: (i * 61) % pages, data: &data }).collect();
    s.write(&ops).unwrap();
    assert_eq!(*below.runs.lock(), vec![1], "one run: the first chunks are adjacent");
    for round in 0..50u64 {
        let ops: Vec<WriteOp<'_>> =
            (0..64).map(|i| WriteOp { page: (i * 61 + round * 7) % pages, data: &data }).collect();
        s.write(&ops).unwrap();
    }
    let runs = below.runs.lock();
    let worst = runs.iter().max().unwrap();
    assert!(*worst <= 64 / CHUNK_SLOTS, "a 64-page batch took {worst} runs: {runs:?}");
}

/// Random writes, reads and discards against a model, on a store small
/// enough that chunks are reused and the partly-free path is taken.
#[test]
fn random_operations_match_a_model_through_chunk_reuse() {
    let pages = 96;
    let s = Append::new(ram(slots_for(pages)), pages).unwrap();
    random_operations_match_a_model(&s, page_of);
}

#[test]
fn reads_racing_rewrites_get_whole_pages_of_their_own() {
    let below = SlowReads(ram(slots_for(64)));
    let versions = Versions { tag: |p, v| p << 32 | v, page_of_tag: |t| t >> 32, bytes: page_of };
    reads_racing_rewrites_get_whole_pages(Arc::new(Append::new(below, 64).unwrap()), versions);
}

#[test]
fn a_failed_write_keeps_the_old_bytes_and_frees_its_slots() {
    let pages = 16;
    let below = Flaky::new(slots_for(pages));
    let s = Append::new(Arc::clone(&below), pages).unwrap();
    s.write(&[WriteOp { page: 3, data: &page_of(1) }]).unwrap();
    below.dead.store(true, SeqCst);
    let all: Vec<u8> = (0..pages).flat_map(page_of).collect();
    assert!(s.write(&[WriteOp { page: 0, data: &all }]).is_err());
    below.dead.store(false, SeqCst);
    assert_eq!(read_one(&s, 3), page_of(1));
    // Were the failed write's slots still taken, these would find none.
    for round in 0..4 {
        let data: Vec<u8> = (0..pages).flat_map(|p| page_of(p + round)).collect();
        s.write(&[WriteOp { page: 0, data: &data }]).unwrap();
    }
    assert_eq!(read_one(&s, 3), page_of(6));
}

#[test]
fn a_store_below_too_small_is_refused_and_bad_requests_are_refused() {
    let err = Append::new(ram(100), 64).err().unwrap();
    assert!(err.to_string().contains("need 128 slots"), "{err}");
    let s = Append::new(ram(slots_for(8)), 8).unwrap();
    assert!(matches!(
        s.write(&[WriteOp { page: 8, data: &page_of(0) }]),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(s.discard(7, 2).is_err());
    let mut short = vec![0u8; 100];
    assert!(s.read(&mut [ReadOp { page: 0, buf: &mut short }]).is_err());
}
