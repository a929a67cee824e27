//! Prefetch reads in flight on the fetch thread, over stores whose
//! multi-page reads answer late: a fault on a page being fetched waits for
//! that read and gets the right bytes, and a page discarded while its read
//! is in flight reads zero afterwards, not its old bytes.

use memlend_fault::{Region, RegionConfig};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const PAGES: usize = 4096;
const BUDGET_PAGES: usize = 512;

/// Reads of more than one page (prefetch windows) are answered 30 ms late;
/// single-page reads (faults) and writes are not.
struct SlowWindows(RamStore);

impl PageStore for SlowWindows {
    fn info(&self) -> StoreInfo {
        self.0.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        // The bytes are taken first and delivered late, as a donor's reply
        // is: a discard meanwhile does not change them.
        let result = self.0.read(ops);
        let bytes: usize = ops.iter().map(|op| op.buf.len()).sum();
        if bytes > PAGE_SIZE {
            std::thread::sleep(Duration::from_millis(30));
        }
        result
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.0.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.0.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.0.flush()
    }
}

fn region(store: Arc<dyn PageStore>) -> Region {
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: BUDGET_PAGES,
        evict_batch_pages: 32,
    };
    Region::new(config, store).unwrap()
}

fn word(region: &Region, page: usize) -> *mut u64 {
    assert!(page < PAGES);
    (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64
}

fn value(page: usize) -> u64 {
    (page as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn write_all(region: &Region) {
    for page in 0..PAGES {
        // SAFETY: an aligned word inside the live region; one thread.
        unsafe { word(region, page).write_volatile(value(page)) };
    }
}

fn read(region: &Region, page: usize) -> u64 {
    // SAFETY: as in `write_all`.
    unsafe { word(region, page).read_volatile() }
}

#[test]
fn a_scan_that_catches_up_with_its_prefetch_waits_and_reads_right() {
    let ram = RamStore::new(PAGES as u64, RamOptions::default()).unwrap();
    let region = region(Arc::new(SlowWindows(ram)));
    write_all(&region);
    for page in 0..PAGES - BUDGET_PAGES {
        assert_eq!(read(&region, page), value(page), "page {page}");
    }
    let h = region.handler_stats();
    assert!(h.pages_prefetched > 1000, "{h:?}");
    assert!(h.faults_waited_on_fetch > 0, "no fault waited on a 30 ms read: {h:?}");
}

/// A store whose multi-page reads, once closed, take their bytes and then
/// wait for the gate to open (5 s at most, so a bug cannot hang the suite).
struct Gated {
    ram: RamStore,
    gate: Mutex<Gate>,
    changed: Condvar,
}

#[derive(Default)]
struct Gate {
    closed: bool,
    waiting: usize,
    /// Multi-page reads begun, and answered.
    started: u64,
    answered: u64,
}

impl Gated {
    fn set_closed(&self, closed: bool) {
        self.gate.lock().unwrap().closed = closed;
        self.changed.notify_all();
    }

    fn waiting(&self) -> usize {
        self.gate.lock().unwrap().waiting
    }

    /// Every window read sent (`sent` of them) has been answered, or one
    /// is held at the gate.
    fn settled(&self, sent: u64) -> bool {
        let gate = self.gate.lock().unwrap();
        gate.waiting > 0 || (gate.started >= sent && gate.answered == gate.started)
    }
}

impl PageStore for Gated {
    fn info(&self) -> StoreInfo {
        self.ram.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        let window = ops.iter().map(|op| op.buf.len()).sum::<usize>() > PAGE_SIZE;
        if window {
            self.gate.lock().unwrap().started += 1;
        }
        let result = self.ram.read(ops);
        if window {
            let mut gate = self.gate.lock().unwrap();
            gate.waiting += 1;
            self.changed.notify_all();
            let wait = Duration::from_secs(5);
            let (g, _) = self.changed.wait_timeout_while(gate, wait, |g| g.closed).unwrap();
            gate = g;
            gate.waiting -= 1;
            gate.answered += 1;
        }
        result
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.ram.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.ram.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.ram.flush()
    }
}

#[test]
fn a_page_discarded_while_its_prefetch_is_in_flight_reads_zero() {
    let ram = RamStore::new(PAGES as u64, RamOptions::default()).unwrap();
    let store = Arc::new(Gated { ram, gate: Mutex::default(), changed: Condvar::new() });
    let region = region(store.clone());
    write_all(&region);
    // The first pages are in the store now; a scan starts a trend. Once it
    // runs, the next prefetch window read takes the old bytes and is held.
    // After each page the scan waits until every window sent has been read
    // or is held, so it never faults into a held window itself (2 ms first:
    // the window a fault asks for is sent after that fault is answered).
    let mut page = 0;
    let sent = || region.handler_stats().prefetch_reads;
    while store.waiting() == 0 {
        assert_eq!(read(&region, page), value(page), "page {page}");
        page += 1;
        if page == 64 {
            store.set_closed(true);
        }
        if page >= 64 {
            std::thread::sleep(Duration::from_millis(2));
        }
        for _ in 0..1000 {
            if store.settled(sent()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(page < 2048, "no prefetch window went out");
    }
    // Discard from there on, with that read in flight; it answers 50 ms
    // later (the handler may wait for it before it lets the discard end).
    let (first, count) = (page, 1024);
    let opener = std::thread::spawn({
        let store = store.clone();
        move || {
            std::thread::sleep(Duration::from_millis(50));
            store.set_closed(false);
        }
    });
    region.discard(first * PAGE_SIZE, count * PAGE_SIZE).unwrap();
    opener.join().unwrap();
    // Let the read end before anything touches the range: a wrong handler
    // maps its old bytes then (read at once, the zero-filled pages ahead
    // of the reads would hide that).
    std::thread::sleep(Duration::from_millis(100));
    for page in 0..PAGES {
        let want = if (first..first + count).contains(&page) { 0 } else { value(page) };
        assert_eq!(read(&region, page), want, "page {page}");
    }
}
