//! Store failures: a failed write-back keeps the pages resident, intact; a
//! failed read poisons the page, so the faulting thread gets SIGBUS rather
//! than waiting forever. Handler failure: pages not mapped raise SIGBUS,
//! mapped ones keep their bytes, madvise and drop do not hang.

use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

/// A RAM store whose reads or writes always fail.
struct Failing {
    inner: RamStore,
    reads: bool,
    writes: bool,
}

impl Failing {
    fn new(pages: u64, reads: bool, writes: bool) -> Arc<Failing> {
        let inner = RamStore::new(pages, RamOptions::default()).unwrap();
        Arc::new(Failing { inner, reads, writes })
    }
}

fn refused() -> StoreError {
    StoreError::Unavailable("refused by the test".into())
}

impl PageStore for Failing {
    fn info(&self) -> StoreInfo {
        self.inner.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        if self.reads {
            return Err(refused());
        }
        self.inner.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        if self.writes {
            return Err(refused());
        }
        self.inner.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.inner.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }
}

const PAGES: usize = 64;

fn region(store: Arc<Failing>) -> Region {
    let config =
        RegionConfig { size_bytes: PAGES * PAGE_SIZE, budget_pages: 8, evict_batch_pages: 4 };
    Region::new(config, store).unwrap()
}

/// Write byte `page + 1` over every page (none all zeroes: those would be
/// dropped, not written back), then check every page.
fn fill_and_check(region: &Region) {
    // SAFETY: the region is a live, writable mapping of `len()` bytes while
    // `region` is borrowed, and only this thread touches it.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    for (page, chunk) in mem.chunks_mut(PAGE_SIZE).enumerate() {
        chunk.fill(page as u8 + 1);
    }
    for (page, chunk) in mem.chunks(PAGE_SIZE).enumerate() {
        assert!(chunk.iter().all(|&b| b == page as u8 + 1), "page {page}");
    }
}

#[test]
fn failed_write_back_keeps_pages_resident() {
    let region = region(Failing::new(PAGES as u64, false, true));
    fill_and_check(&region);
    // The last batch's failure is settled by the handler once the
    // write-back thread reports it (within a poll interval, 1 ms).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut stats = region.stats();
    while stats.pages_resident as usize != PAGES && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        stats = region.stats();
    }
    assert_eq!(stats.pages_written_back, 0, "{stats:?}");
    assert_eq!(stats.pages_resident as usize, PAGES, "over budget, not lost");
    assert_eq!(stats.faults_from_store, 0);
}

const CHILD_ENV: &str = "MEMLEND_FAULT_POISON_CHILD";

/// Run the ignored test `name` in a fresh process; it must die of SIGBUS
/// within 10 s, having printed `marker`.
fn dies_of_sigbus(name: &str, marker: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--exact", name, "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A faulter left waiting would hang the child: give it 10 s at most.
    let mut status = None;
    for _ in 0..200 {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(status) = status else {
        child.kill().unwrap();
        child.wait().unwrap();
        panic!("{name}: the faulting thread was left waiting");
    };
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert!(stdout.contains(marker), "child did not get there: {stdout}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}: {stdout}");
}

#[test]
fn failed_read_raises_sigbus_in_the_faulter() {
    dies_of_sigbus("poison_child", "evicted; touching");
}

#[test]
#[ignore = "run by failed_read_raises_sigbus_in_the_faulter in its own process"]
fn poison_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let region = region(Failing::new(PAGES as u64, true, false));
    // SAFETY: as in `fill_and_check`.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    for chunk in mem.chunks_mut(PAGE_SIZE) {
        chunk[0] = 1;
    }
    assert!(region.stats().pages_written_back > 0);
    println!("evicted; touching page 0");
    let first = std::hint::black_box(mem[0]);
    println!("survived a failed read, read {first}");
}

/// A region with a healthy store whose handler is made to fail: no eviction
/// ahead or prefetch, so the last pages written are surely mapped.
fn failing_handler_region() -> Region {
    let config =
        RegionConfig { size_bytes: PAGES * PAGE_SIZE, budget_pages: 8, evict_batch_pages: 4 };
    let tuning = Tuning { prefetch_pages_max: 0, low_water_pages: Some(0), ..Tuning::default() };
    Region::with_tuning(config, tuning, Failing::new(PAGES as u64, false, false)).unwrap()
}

/// Fill every page with its number, then make the handler fail: the
/// discard wakes it, it panics, and it must read the discard's event even
/// so.
fn fill_then_fail(region: &mut Region) -> &mut [u8] {
    // SAFETY: the region is a live, writable mapping of `len()` bytes while
    // `region` is borrowed, and only this thread touches it.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    for (page, chunk) in mem.chunks_mut(PAGE_SIZE).enumerate() {
        chunk.fill(page as u8);
    }
    region.fail_handler_for_tests();
    region.discard(0, 2 * PAGE_SIZE).unwrap();
    mem
}

#[test]
fn after_a_handler_failure_mapped_pages_keep_their_bytes_and_drop_returns() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut region = failing_handler_region();
        let mem = fill_then_fail(&mut region);
        let last = PAGES - 1;
        assert!(mem[last * PAGE_SIZE..].iter().all(|&b| b == last as u8));
        // The discard returned once its event was read, maybe before the
        // poisoning finished.
        let mut stats = region.stats();
        for _ in 0..500 {
            if stats.pages_poisoned > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            stats = region.stats();
        }
        assert_eq!(region.handler_stats().handler_failures, 1, "{stats:?}");
        assert!(stats.pages_poisoned >= (PAGES - 10) as u64, "{stats:?}");
        drop(region);
        done_tx.send(()).unwrap();
    });
    done_rx.recv_timeout(Duration::from_secs(20)).expect("hung after a handler failure");
}

#[test]
fn a_fault_after_a_handler_failure_raises_sigbus() {
    dies_of_sigbus("handler_failure_child", "failed; touching");
}

#[test]
#[ignore = "run by a_fault_after_a_handler_failure_raises_sigbus in its own process"]
fn handler_failure_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let mut region = failing_handler_region();
    let mem = fill_then_fail(&mut region);
    println!("failed; touching page 10, which is in the store");
    let got = std::hint::black_box(mem[10 * PAGE_SIZE]);
    println!("survived a handler failure, read {got}");
}
