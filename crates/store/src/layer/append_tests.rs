use super::*;
use crate::layer::flaky::Flaky;
use crate::ram::{RamOptions, RamStore};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

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

/// Reads that take a while after their lookup: the window in which a
/// slot reused too soon would be rewritten under them.
struct SlowReads(RamStore);

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
                let data: Vec<u8> = (0..count).flat_map(|i| page_of(step << 8 | i)).collect();
                s.write(&[WriteOp { page, data: &data }]).unwrap();
                for i in 0..count {
                    model.insert(page + i, step << 8 | i);
                }
            }
            _ => {
                let want = model.get(&page).map_or(vec![0; PAGE_SIZE], |&t| page_of(t));
                assert_eq!(read_one(&s, page), want, "page {page} at step {step}");
            }
        }
    }
    for page in 0..pages {
        let want = model.get(&page).map_or(vec![0; PAGE_SIZE], |&t| page_of(t));
        assert_eq!(read_one(&s, page), want, "page {page} at the end");
    }
}

/// Writers rewrite their own pages while readers read everyone's: a read
/// returns one whole version of that very page, never a page whose slot
/// was reused under it.
#[test]
fn reads_racing_rewrites_get_whole_pages_of_their_own() {
    let pages = 64u64;
    let s = Arc::new(Append::new(SlowReads(ram(slots_for(pages))), pages).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let tag = |page: u64, version: u64| page << 32 | version;
    for page in 0..pages {
        s.write(&[WriteOp { page, data: &page_of(tag(page, 0)) }]).unwrap();
    }
    let mut threads = Vec::new();
    for w in 0..2u64 {
        let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut version = 1;
            while !stop.load(SeqCst) {
                let batch: Vec<(u64, Vec<u8>)> = (0..8)
                    .map(|i| (w * 32 + (version * 5 + i) % 32, version))
                    .map(|(p, v)| (p, page_of(tag(p, v))))
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
                let got = read_one(&*s, page);
                let first = u64::from_le_bytes(got[..8].try_into().unwrap());
                assert_eq!(first >> 32, page, "page {page} read another page's bytes");
                assert_eq!(got, page_of(first), "page {page} torn");
            }
        }));
    }
    threads.into_iter().for_each(|t| t.join().unwrap());
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
