use super::*;
use crate::ram::{RamOptions, RamStore};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

fn ram(pages: u64) -> Arc<dyn PageStore> {
    Arc::new(RamStore::new(pages, RamOptions::default()).unwrap())
}

/// Page content: its index and a version in every word.
fn content(page: u64, version: u64) -> Vec<u8> {
    let word = (page << 32 | version).to_le_bytes();
    word.iter().copied().cycle().take(PAGE_SIZE).collect()
}

fn read_page(s: &dyn PageStore, page: u64) -> Vec<u8> {
    let mut buf = vec![0u8; PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
    buf
}

fn none(_: Progress) {}

#[test]
fn every_page_moves_and_reads_back() {
    let r = Relocatable::new(ram(4096));
    for p in 0..4096 {
        r.write(&[WriteOp { page: p, data: &content(p, 1) }]).unwrap();
    }
    let target = ram(4096);
    let seen = AtomicU64::new(0);
    let rep = r
        .relocate(Arc::clone(&target), RelocateOptions::default(), &|p| {
            seen.store(p.pages_copied, Ordering::Relaxed)
        })
        .unwrap();
    assert_eq!((rep.pages_copied, seen.load(Ordering::Relaxed)), (4096, 4096));
    for p in 0..4096 {
        assert!(read_page(&*target, p) == content(p, 1), "page {p} on the target");
        assert!(read_page(&r, p) == content(p, 1));
    }
    // Writes now go to the target only.
    r.write(&[WriteOp { page: 7, data: &content(7, 2) }]).unwrap();
    assert!(read_page(&*rep.old, 7) == content(7, 1));
    assert!(read_page(&*target, 7) == content(7, 2));
}

/// Writers race the copy, back and forth many times: every page ends as its
/// last completed write left it.
#[test]
fn concurrent_writes_are_never_lost() {
    const PAGES: u64 = 2048;
    let stores = [ram(PAGES), ram(PAGES)];
    let r = Arc::new(Relocatable::new(Arc::clone(&stores[0])));
    let last: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (r, last, stop) = (Arc::clone(&r), Arc::clone(&last), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9u64 + w;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Each writer owns the pages p with p % 3 == w: versions
                    // per page only grow, and "last" is exact.
                    let page = (x % (PAGES / 3)) * 3 + w;
                    let v = last[page as usize].load(Ordering::Relaxed) + 1;
                    r.write(&[WriteOp { page, data: &content(page, v) }]).unwrap();
                    last[page as usize].store(v, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for round in 0..20 {
        let fresh = ram(PAGES);
        let rep = r
            .relocate(
                Arc::clone(&fresh),
                RelocateOptions { batch_pages: 16, ..Default::default() },
                &none,
            )
            .unwrap();
        assert_eq!(rep.pages_copied, PAGES, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    for p in 0..PAGES {
        let v = last[p as usize].load(Ordering::Relaxed);
        let want = if v == 0 { vec![0u8; PAGE_SIZE] } else { content(p, v) };
        assert!(read_page(&*r, p) == want, "page {p} lost version {v}");
    }
}

#[test]
fn a_deadline_leaves_everything_on_the_old_store() {
    let r = Relocatable::new(ram(1024));
    r.write(&[WriteOp { page: 5, data: &content(5, 1) }]).unwrap();
    let target = ram(1024);
    let slow = |_: Progress| std::thread::sleep(Duration::from_millis(2));
    let deadline = Some(Instant::now() + Duration::from_millis(10));
    let e = r
        .relocate(Arc::clone(&target), RelocateOptions { batch_pages: 8, deadline }, &slow)
        .err()
        .unwrap();
    assert!(matches!(e, RelocateError::DeadlineExceeded { .. }), "{e}");
    r.write(&[WriteOp { page: 6, data: &content(6, 1) }]).unwrap();
    assert!(read_page(&r, 5) == content(5, 1) && read_page(&r, 6) == content(6, 1));
    assert!(
        read_page(&*target, 6) == vec![0u8; PAGE_SIZE],
        "the target is not used after a failed move"
    );
}

/// A target that fails after some writes.
struct Failing {
    inner: Arc<dyn PageStore>,
    writes_left: AtomicUsize,
}

impl PageStore for Failing {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        if self.writes_left.fetch_sub(1, Ordering::Relaxed) == 0 {
            return Err(StoreError::Unavailable("injected".into()));
        }
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
fn a_failing_target_aborts_cleanly_and_bad_shapes_are_refused() {
    let r = Relocatable::new(ram(256));
    for p in 0..256 {
        r.write(&[WriteOp { page: p, data: &content(p, 3) }]).unwrap();
    }
    let bad = Arc::new(Failing { inner: ram(256), writes_left: AtomicUsize::new(3) });
    let e = r
        .relocate(bad, RelocateOptions { batch_pages: 16, ..Default::default() }, &none)
        .err()
        .unwrap();
    assert!(matches!(e, RelocateError::Store { .. }), "{e}");
    for p in 0..256 {
        assert!(read_page(&r, p) == content(p, 3));
    }
    assert!(matches!(
        r.relocate(ram(255), RelocateOptions::default(), &none),
        Err(RelocateError::TooSmall { .. })
    ));
    r.cancel(); // no move under way: harmless
    r.relocate(ram(300), RelocateOptions::default(), &none).unwrap();
    assert!(read_page(&r, 255) == content(255, 3));
}

#[test]
fn only_one_move_at_a_time() {
    let r = Arc::new(Relocatable::new(ram(4096)));
    let r2 = Arc::clone(&r);
    let started = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&started);
    let t = std::thread::spawn(move || {
        let slow = |_: Progress| {
            s2.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        };
        r2.relocate(ram(4096), RelocateOptions { batch_pages: 64, ..Default::default() }, &slow)
    });
    while !started.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    assert!(matches!(
        r.relocate(ram(4096), RelocateOptions::default(), &none),
        Err(RelocateError::Busy)
    ));
    r.cancel();
    assert!(matches!(t.join().unwrap(), Err(RelocateError::Cancelled { .. })));
}

#[test]
fn replace_swaps_at_once_and_refuses_a_smaller_store() {
    let r = Relocatable::new(ram(64));
    r.write(&[WriteOp { page: 3, data: &content(3, 1) }]).unwrap();
    assert!(matches!(r.replace(ram(32)), Err(RelocateError::TooSmall { target: 32, needed: 64 })));
    let old = r.replace(ram(64)).unwrap();
    assert!(read_page(&*old, 3) == content(3, 1));
    assert!(read_page(&r, 3) == vec![0; PAGE_SIZE], "nothing is copied");
    r.write(&[WriteOp { page: 3, data: &content(3, 2) }]).unwrap();
    assert!(read_page(&*old, 3) == content(3, 1), "writes go to the new store only");
}

/// Not a timed test: prints what the layer adds to a 4 KiB read.
#[test]
fn fast_path_cost() {
    let inner = ram(1024);
    let r = Relocatable::new(Arc::clone(&inner));
    let mut buf = vec![0u8; PAGE_SIZE];
    let time = |s: &dyn PageStore, buf: &mut Vec<u8>| {
        let t = Instant::now();
        for i in 0..200_000u64 {
            s.read(&mut [ReadOp { page: i % 1024, buf: &mut buf[..] }]).unwrap();
        }
        t.elapsed().as_nanos() as f64 / 200_000.0
    };
    let bare = time(&*inner, &mut buf);
    let layered = time(&r, &mut buf);
    eprintln!("4 KiB read over RAM: {bare:.0} ns bare, {layered:.0} ns through relocate");
}
