//! fork of a process that owns a region whose pages do not fit its budget:
//! the parent's dirty pages are written out at the fork, so the child
//! shares none and reads every page as it was at the fork through its
//! parent, from a snapshot of the store, while the parent rewrites them all;
//! the parent's eviction copes with pages the fork had shared. A lazy fork
//! writes them after it instead, and the child drops its shared copies as
//! it is told of each write.

use memlend_fault::{serve_child, serve_link, ChildRegion, Discarded, LinkSource};
use memlend_fault::{ForkWritten, ParentCopy, Region, RegionConfig};
use memlend_store::layer::snapshot::{LateOwed, Owed, Snapshots};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

const PAGES: usize = 512;
const BUDGET_PAGES: usize = 64;
const CHILD_BUDGET_PAGES: usize = 16;
const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;
/// Pages the racing writer rewrites: well within the budget.
const HOT_PAGES: usize = 16;

fn pattern(page: usize, word: usize, seed: u64) -> u64 {
    (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (word as u64) << 40 ^ seed | 1
}

fn word(base: usize, page: usize, w: usize) -> *mut u64 {
    (base + page * PAGE_SIZE + w * 8) as *mut u64
}

fn fill(base: usize, pages: std::ops::Range<usize>, seed: u64) {
    for page in pages {
        for w in 0..WORDS_PER_PAGE {
            // SAFETY: an aligned word of the live region, one writer.
            unsafe { word(base, page, w).write_volatile(pattern(page, w, seed)) };
        }
    }
}

/// The first page (and word) that does not hold `seed`'s pattern.
fn first_wrong(base: usize, pages: std::ops::Range<usize>, seed: u64) -> Option<(usize, usize)> {
    for page in pages {
        for w in 0..WORDS_PER_PAGE {
            // SAFETY: as in `fill`.
            if unsafe { word(base, page, w).read_volatile() } != pattern(page, w, seed) {
                return Some((page, w));
            }
        }
    }
    None
}

/// The child's region: pages `in_store` read through the link, the
/// child's budget, none pending.
fn child_region(base: usize, in_store: Vec<u64>, discarded: Arc<Discarded>) -> ChildRegion {
    ChildRegion {
        base,
        pages: PAGES as u32,
        in_store,
        budget_pages: CHILD_BUDGET_PAGES,
        discarded,
        pending: Vec::new(),
        notices: None,
    }
}

/// In the child: its own handler, then every page checked. The exit code
/// says what was wrong (0: nothing).
fn child(base: usize, in_store: Vec<u64>, link: UnixStream) -> i32 {
    let discarded = Arc::new(Discarded::new(PAGES as u32));
    let region = child_region(base, in_store, Arc::clone(&discarded));
    if serve_child(region, Box::new(LinkSource::new(link))).is_err() {
        return 2;
    }
    // The parent wrote every dirty page out before the fork, so the child
    // shares none: it holds no page it did not bring in itself.
    let mut mapped = vec![0u8; PAGES];
    // SAFETY: one byte a page of the region into `mapped`; reads no page.
    if unsafe { libc::mincore(base as *mut _, PAGES * PAGE_SIZE, mapped.as_mut_ptr()) } != 0
        || mapped.iter().any(|&b| b & 1 != 0)
    {
        return 7;
    }
    // Written pages are kept; the rest of what is read in is dropped again.
    fill(base, 0..8, 3);
    if first_wrong(base, 8..PAGES, 1).is_some() {
        return 3;
    }
    if first_wrong(base, 0..8, 3).is_some() {
        return 4;
    }
    // A page the child discards reads zero, not its store bytes.
    discarded.set_range(300, 1);
    // SAFETY: drops one page of the region in this process.
    unsafe { libc::madvise(word(base, 300, 0).cast(), PAGE_SIZE, libc::MADV_DONTNEED) };
    // SAFETY: as in `fill`.
    if unsafe { word(base, 300, 5).read_volatile() } != 0 {
        return 5;
    }
    if first_wrong(base, 301..PAGES, 1).is_some() {
        return 6;
    }
    0
}

/// A region over a snapshot store, every page written once with seed 1;
/// None (the test is counted skipped) where userfaultfd is not allowed.
fn region_filled() -> Option<(Arc<Snapshots<RamStore>>, Region)> {
    if let Err(why) = memlend_fault::check_access() {
        memlend_testskip::skip(&format!("userfaultfd: {why}"));
        return None;
    }
    let store =
        Arc::new(Snapshots::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap()));
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: BUDGET_PAGES,
        evict_batch_pages: 8,
    };
    let region = Region::new(config, store.clone()).unwrap();
    fill(region.as_ptr() as usize, 0..PAGES, 1);
    Some((store, region))
}

/// Pause, fork a child that runs `child` and exits with its code, serve it
/// from the snapshot, run `meanwhile` in the parent; returns the child's
/// exit code, the pages sent to it (and how many of them were copied from
/// the parent's memory) and the old pages kept for it.
fn fork_and_serve(
    store: &Arc<Snapshots<RamStore>>,
    region: &Region,
    child: fn(usize, Vec<u64>, UnixStream) -> i32,
    meanwhile: impl FnOnce(),
) -> (i32, (u64, u64), u64) {
    let base = region.as_ptr() as usize;
    let paused = region.pause().unwrap();
    let in_store = paused.in_store_bits().to_vec();
    let mut owed = Owed::new(PAGES as u64);
    (0..PAGES as u64).filter(|&p| paused.in_store(p)).for_each(|p| owed.set(p));
    assert_eq!(owed.count(), PAGES as u64, "every page is in the store, mapped or not");
    let snapshot = store.take(owed).unwrap();
    let (parent_end, child_end) = UnixStream::pair().unwrap();
    // SAFETY: the child runs only `child` (its own thread, the region's
    // pages) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop(parent_end);
        let code = std::panic::catch_unwind(move || child(base, in_store, child_end)).unwrap_or(9);
        // SAFETY: leaves the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) };
    }
    drop(child_end);
    let copy = region.parent_copy(paused.number()).unwrap();
    drop(paused);
    let server = serve_from(store, snapshot, copy, parent_end);
    meanwhile();
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    let sent = server.join().unwrap().unwrap();
    let kept = store.stats().kept_pages;
    store.release(snapshot);
    (libc::WEXITSTATUS(status), sent, kept)
}

/// A thread rewriting `pages` with a new seed each pass until told to
/// stop; it returns the next seed.
fn rewriting(
    base: usize,
    pages: std::ops::Range<usize>,
) -> (Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = Arc::clone(&stop);
    let writer = std::thread::spawn(move || {
        let mut seed = 10;
        // Bounded: ends when the parent says so, a pass at a time.
        while !told.load(std::sync::atomic::Ordering::Relaxed) {
            fill(base, pages.clone(), seed);
            seed += 1;
        }
        seed
    });
    (stop, writer)
}

/// A thread answering the child's link as the preload shim does: from the
/// parent's memory where `copy` finds the fork's bytes there, else from
/// `snapshot`. Returns the pages sent and how many of them were copied.
fn serve_from<S: PageStore + Send + Sync + 'static>(
    store: &Arc<Snapshots<S>>,
    snapshot: u64,
    copy: ParentCopy,
    parent_end: UnixStream,
) -> std::thread::JoinHandle<std::io::Result<(u64, u64)>> {
    let store = store.clone();
    std::thread::spawn(move || {
        let mut copied = 0u64;
        let read = |page: u32, buf: &mut [u8]| {
            let unchanged = || store.unchanged(snapshot, u64::from(page)).unwrap_or(false);
            if copy.copy(page, buf, unchanged)? {
                copied += 1;
                return Ok(());
            }
            store.read_snapshot(snapshot, u64::from(page), buf).map_err(std::io::Error::other)
        };
        let sent = serve_link(parent_end, read, &std::sync::atomic::AtomicU64::new(0))?;
        Ok((sent, copied))
    })
}

/// A fork in one test shares every other test's region too (the whole
/// address space is copied), and the pages counted below depend on which
/// forks shared them: the tests here fork one at a time.
static ONE_FORK_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn fork_turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_FORK_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn a_forked_child_reads_the_region_as_it_was_while_the_parent_rewrites_it() {
    let _turn = fork_turn();
    let Some((store, region)) = region_filled() else { return };
    let base = region.as_ptr() as usize;
    // Every page rewritten, shared ones and far ones, twice over the budget.
    let (code, (sent, _), kept) =
        fork_and_serve(&store, &region, child, || fill(base, 0..PAGES, 2));
    assert_eq!(code, 0, "the child found a wrong page");
    assert!(sent >= PAGES as u64, "{sent} pages sent for {PAGES} owed");
    assert!(kept > 0, "the parent's writes kept old bytes");

    assert_eq!(first_wrong(base, 0..PAGES, 2), None, "the parent's own pages");
    fill(base, 0..PAGES, 4);
    assert_eq!(first_wrong(base, 0..PAGES, 4), None);
    let h = region.handler_stats();
    assert_eq!(h.forks, 1);
    let cleaned = h.pages_cleaned_for_fork;
    assert!(cleaned > 0 && cleaned <= BUDGET_PAGES as u64, "{cleaned} pages cleaned");
    // Every page the fork shared was unshared a batch at a time, keeping
    // its state, before its move: none had to be written to one by one.
    assert!(h.pages_unshared_ahead > 0, "no shared page had to be unshared to move out");
    assert_eq!(h.pages_unshared, 0, "pages unshared one by one after a failed move");
    let resident = region.stats().pages_resident as usize;
    assert!(resident <= BUDGET_PAGES, "{resident} pages resident, budget {BUDGET_PAGES}");
}

/// A fork the region was not paused for (a raw `fork`, no atfork
/// handlers) also leaves every mapped page not anon-exclusive, but marks
/// none: eviction must find them refused and unshare them one by one.
#[test]
fn pages_a_fork_shared_unannounced_still_move_out_one_by_one() {
    let _turn = fork_turn();
    let Some((_store, region)) = region_filled() else { return };
    let base = region.as_ptr() as usize;
    // SAFETY: the child runs nothing of ours: it leaves at once.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    // Every page rewritten: the ones mapped at the fork must move out.
    fill(base, 0..PAGES, 2);
    assert_eq!(first_wrong(base, 0..PAGES, 2), None);
    let h = region.handler_stats();
    assert!(h.pages_unshared > 0, "no shared page was unshared to move out");
    assert_eq!(h.pages_unshared_ahead, 0, "no pause marked any page");
    assert!(region.stats().pages_resident as usize <= BUDGET_PAGES);
}

/// In the child: copy the pages it shares with its parent (the kernel's
/// copy of the fork moment), then serve the region, which drops them and
/// reads them through the parent: the bytes must be the same.
fn child_compares_shared(base: usize, in_store: Vec<u64>, link: UnixStream) -> i32 {
    let mut mapped = vec![0u8; PAGES];
    // SAFETY: one byte a page of the region into `mapped`; reads no page.
    if unsafe { libc::mincore(base as *mut _, PAGES * PAGE_SIZE, mapped.as_mut_ptr()) } != 0 {
        return 2;
    }
    let shared: Vec<(usize, Vec<u8>)> = (0..PAGES)
        .filter(|&p| mapped[p] & 1 != 0)
        .map(|p| {
            // SAFETY: the page is mapped in this process (mincore above)
            // and nothing else runs here yet.
            let bytes =
                unsafe { std::slice::from_raw_parts(word(base, p, 0) as *const u8, PAGE_SIZE) };
            (p, bytes.to_vec())
        })
        .collect();
    if shared.is_empty() {
        return 8;
    }
    let discarded = Arc::new(Discarded::new(PAGES as u32));
    let region = child_region(base, in_store, discarded);
    if serve_child(region, Box::new(LinkSource::new(link))).is_err() {
        return 2;
    }
    for (page, bytes) in shared {
        // SAFETY: a page of the region, served by this child's handler.
        let now =
            unsafe { std::slice::from_raw_parts(word(base, page, 0) as *const u8, PAGE_SIZE) };
        if now != bytes.as_slice() {
            return 3;
        }
    }
    0
}

/// In the child: every page read three times over (its budget drops them
/// between passes), each as at the fork.
fn child_reads_thrice(base: usize, in_store: Vec<u64>, link: UnixStream) -> i32 {
    let region = child_region(base, in_store, Arc::new(Discarded::new(PAGES as u32)));
    if serve_child(region, Box::new(LinkSource::new(link))).is_err() {
        return 2;
    }
    for _ in 0..3 {
        if first_wrong(base, 0..PAGES, 1).is_some() {
            return 3;
        }
    }
    0
}

/// Fork a child that reads every page three times while the parent
/// rewrites `write` for 30 ms and (if given) reads `read` for 100 ms, each
/// round and round;
/// returns the child's exit code, the pages sent, copied and kept.
fn thrice_while(
    store: &Arc<Snapshots<RamStore>>,
    region: &Region,
    write: std::ops::Range<usize>,
    read: Option<std::ops::Range<usize>>,
) -> (i32, u64, u64, u64) {
    let base = region.as_ptr() as usize;
    let (code, (sent, copied), kept) = fork_and_serve(store, region, child_reads_thrice, || {
        let (stop_writing, writer) = rewriting(base, write);
        let stop_reading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = read.map(|pages| reading(base, pages, Arc::clone(&stop_reading)));
        // The reads go on after the writes: a page written, evicted and
        // read again then stays mapped with bytes other than the fork's.
        std::thread::sleep(std::time::Duration::from_millis(30));
        stop_writing.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(writer.join().unwrap() > 10, "the writer finished no pass");
        std::thread::sleep(std::time::Duration::from_millis(70));
        stop_reading.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(reader) = reader {
            reader.join().unwrap();
        }
    });
    (code, sent, copied, kept)
}

/// A thread reading a word of each of `pages` round and round until told.
fn reading(
    base: usize,
    pages: std::ops::Range<usize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // Bounded: ends when told, a pass at a time.
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for page in pages.clone() {
                // SAFETY: as in `fill`.
                std::hint::black_box(unsafe { word(base, page, 0).read_volatile() });
            }
        }
    })
}

/// The parent reads half its pages back (each mapped write-protected, so
/// the child's reads of them are copied from the parent's memory) and
/// rewrites a sixteenth, reading those too (one written back, evicted and
/// read again is mapped protected with new bytes), all under eviction,
/// while the child reads every page three times: each copy races reads,
/// writes, write-backs and evictions of the page, and every page must
/// still reach the child as at the fork.
#[test]
fn copies_from_the_parents_memory_racing_its_writes_and_evictions_are_the_fork_moment() {
    let _turn = fork_turn();
    let Some((store, region)) = region_filled() else { return };
    let (write, read) = (PAGES / 2..PAGES / 2 + PAGES / 16, 0..PAGES / 2 + PAGES / 16);
    let (code, sent, copied, kept) = thrice_while(&store, &region, write, Some(read));
    assert_eq!(code, 0, "the child read a page that was not the fork's");
    assert!(sent >= 3 * PAGES as u64 / 2, "{sent} pages sent");
    assert!(copied > 0, "no page was copied from the parent's memory ({sent} sent)");
    assert!(kept > 0, "the parent's writes kept no old bytes");
}

/// The parent rewrites pages it keeps mapped (the last filled: the clean at
/// the pause protects them; never written back while the child reads, so
/// the store's copy stays the fork's) while the child reads every page
/// three times: its other mapped pages are copied, the rewritten ones not,
/// being no longer write-protected.
#[test]
fn a_page_rewritten_since_the_fork_is_not_copied_though_the_store_still_has_the_fork_bytes() {
    let _turn = fork_turn();
    let Some((store, region)) = region_filled() else { return };
    let (code, _, copied, _) = thrice_while(&store, &region, PAGES - HOT_PAGES..PAGES, None);
    assert_eq!(code, 0, "the child read a page that was not the fork's");
    assert!(copied > 0, "no page was copied from the parent's memory");
}

#[test]
fn a_write_racing_the_forks_clean_waits_and_the_child_reads_the_fork_moment() {
    let _turn = fork_turn();
    let Some((store, region)) = region_filled() else { return };
    let base = region.as_ptr() as usize;
    // A writer rewriting the first pages (resident, so it never waits on a
    // fault of its own), a new seed each pass, across the pause and the
    // fork: a page the clean wrote before its protection held would reach
    // the child with other bytes than it shares.
    let (stop, writer) = rewriting(base, 0..HOT_PAGES);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (code, _, _) = fork_and_serve(&store, &region, child_compares_shared, || {
        std::thread::sleep(std::time::Duration::from_millis(50));
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = writer.join().unwrap();
    assert_eq!(code, 0, "the child read other bytes than it shared at the fork");
    assert!(last > 10, "the writer finished no pass");
    assert!(region.handler_stats().pages_cleaned_for_fork > 0, "nothing was cleaned");
    fill(base, 0..PAGES, 99);
    assert_eq!(first_wrong(base, 0..PAGES, 99), None);
}

/// A lazy clean's sink as the shim's: the snapshot owes each page written,
/// then the child hears of it.
struct TestSink {
    late: Arc<LateOwed>,
    to_child: UnixStream,
}

impl ForkWritten for TestSink {
    fn written(&mut self, pages: &[u32]) -> bool {
        use std::io::Write;
        self.late.owe(pages);
        let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.to_child.write_all(&bytes).is_ok()
    }
}

/// In the child of a lazy fork: the pages it shares are the fork's until
/// the parent has written them; then it drops them and reads them through
/// the parent. Every page must read as at the fork, before and after.
fn child_lazy(
    base: usize,
    in_store: Vec<u64>,
    pending: Vec<u64>,
    link: UnixStream,
    notices: UnixStream,
    mut parent_done: UnixStream,
) -> i32 {
    use std::io::Read;
    let pending_count: u32 = pending.iter().map(|w| w.count_ones()).sum();
    if pending_count == 0 {
        return 10;
    }
    let Some(shared) = shared_pages(base) else { return 2 };
    // What each page held at the fork: a shared page its bytes then (a
    // writer was rewriting some), the others the first fill.
    let wrong = || {
        (0..PAGES).any(|p| match shared.iter().find(|(q, _)| *q == p) {
            // SAFETY: a page of the region, served by this child's handler.
            Some((_, bytes)) => unsafe {
                std::slice::from_raw_parts(word(base, p, 0) as *const u8, PAGE_SIZE)
                    != bytes.as_slice()
            },
            None => first_wrong(base, p..p + 1, 1).is_some(),
        })
    };
    let region = ChildRegion {
        base,
        pages: PAGES as u32,
        in_store,
        budget_pages: CHILD_BUDGET_PAGES,
        discarded: Arc::new(Discarded::new(PAGES as u32)),
        pending,
        notices: Some(notices),
    };
    if serve_child(region, Box::new(LinkSource::new(link))).is_err() {
        return 2;
    }
    if wrong() {
        return 3;
    }
    // The parent has rewritten every page: each pending one was written
    // first, and the child was told.
    if parent_done.read_exact(&mut [0u8]).is_err() {
        return 11;
    }
    // Bounded: two seconds for the notices to be taken.
    let mut dropped = false;
    for _ in 0..200 {
        let mut mapped = vec![0u8; PAGES];
        // SAFETY: one byte a page of the region into `mapped`; reads no page.
        if unsafe { libc::mincore(base as *mut _, PAGES * PAGE_SIZE, mapped.as_mut_ptr()) } != 0 {
            return 2;
        }
        dropped = mapped.iter().filter(|&&b| b & 1 != 0).count() <= CHILD_BUDGET_PAGES;
        if dropped {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if !dropped {
        return 5; // still sharing the pages the parent wrote
    }
    // Read again, through the parent where dropped: still the fork's bytes.
    if wrong() {
        return 4;
    }
    0
}

/// The pages mapped in this process, with a copy of their bytes.
fn shared_pages(base: usize) -> Option<Vec<(usize, Vec<u8>)>> {
    let mut mapped = vec![0u8; PAGES];
    // SAFETY: one byte a page of the region into `mapped`; reads no page.
    if unsafe { libc::mincore(base as *mut _, PAGES * PAGE_SIZE, mapped.as_mut_ptr()) } != 0 {
        return None;
    }
    let copy = |p: usize| {
        // SAFETY: the page is mapped (mincore above) and nothing else
        // touches the region here yet.
        unsafe { std::slice::from_raw_parts(word(base, p, 0) as *const u8, PAGE_SIZE) }.to_vec()
    };
    Some((0..PAGES).filter(|&p| mapped[p] & 1 != 0).map(|p| (p, copy(p))).collect())
}

/// A RAM store whose writes take `LAZY_WRITE_MS` each: the lazy clean's
/// idle writes leave the program time to write the pages they come to
/// later.
struct SlowWrites(RamStore);

const LAZY_WRITE_MS: u64 = 2;
/// The lazy test's budget: more dirty pages than one idle write takes.
const LAZY_BUDGET_PAGES: usize = 320;
/// The pages its writer rewrites: the last ones, resident, and the last
/// that the idle writes come to.
const LAZY_HOT: std::ops::Range<usize> = PAGES - HOT_PAGES..PAGES;

impl PageStore for SlowWrites {
    fn info(&self) -> StoreInfo {
        self.0.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.0.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        std::thread::sleep(std::time::Duration::from_millis(LAZY_WRITE_MS));
        self.0.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.0.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.0.flush()
    }
}

/// Checked to fail (the child reads the writer's bytes, not the fork's)
/// with the write before a WP fault's unprotect taken out of `resolve.rs`.
#[test]
fn a_lazy_fork_writes_dirty_pages_after_it_and_the_child_still_reads_the_fork_moment() {
    let _turn = fork_turn();
    if let Err(why) = memlend_fault::check_access() {
        memlend_testskip::skip(&format!("userfaultfd: {why}"));
        return;
    }
    let ram = RamStore::new(PAGES as u64, RamOptions::default()).unwrap();
    let store = Arc::new(Snapshots::new(SlowWrites(ram)));
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: LAZY_BUDGET_PAGES,
        evict_batch_pages: 32,
    };
    let region = Region::new(config, store.clone()).unwrap();
    let base = region.as_ptr() as usize;
    fill(base, 0..PAGES, 1);
    // A writer rewriting resident pages across the pause: its WP faults
    // wait out the pause, then come before any idle write, so each
    // pending page it writes must reach the store with its fork bytes
    // before the new ones.
    let (stop, writer) = rewriting(base, LAZY_HOT);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let paused = region.pause_lazy().unwrap();
    let in_store = paused.in_store_bits().to_vec();
    let pending = paused.pending_bits().to_vec();
    let pending_count: u64 = pending.iter().map(|w| u64::from(w.count_ones())).sum();
    assert!(pending_count > 0, "no dirty page was left pending");
    let mut owed = Owed::new(PAGES as u64);
    (0..PAGES as u64).filter(|&p| paused.in_store(p)).for_each(|p| owed.set(p));
    assert_eq!(owed.count() + pending_count, PAGES as u64, "every page in the store or pending");
    let snapshot = store.take(owed).unwrap();
    let (parent_end, child_end) = UnixStream::pair().unwrap();
    let (to_child, notices) = UnixStream::pair().unwrap();
    let (mut done_tx, done_rx) = UnixStream::pair().unwrap();
    let late = store.late_owed(snapshot).unwrap();
    paused.clean_lazily(Box::new(TestSink { late, to_child }));
    // SAFETY: the child runs only `child_lazy` and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop((parent_end, done_tx));
        let run = move || child_lazy(base, in_store, pending, child_end, notices, done_rx);
        let code = std::panic::catch_unwind(run).unwrap_or(9);
        // SAFETY: leaves the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) };
    }
    drop((child_end, notices, done_rx));
    let copy = region.parent_copy(paused.number()).unwrap();
    drop(paused);
    let server = serve_from(&store, snapshot, copy, parent_end);
    // Some pending pages go in the idle writes, some as the writer
    // rewrites them (a WP fault), the rest as eviction takes them.
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    fill(base, 0..PAGES, 2);
    // A child that found a wrong page has left: its exit code says so.
    let _ = std::io::Write::write_all(&mut done_tx, &[1]);
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child found a wrong page or kept its shares");
    let (_, copied) = server.join().unwrap().unwrap();
    eprintln!("{copied} pages copied from the parent's memory");
    let h = region.handler_stats();
    assert_eq!(h.pages_cleaned_after_fork, pending_count, "every pending page written once");
    assert!(store.stats().kept_pages > 0, "the parent's writes kept old bytes");
    store.release(snapshot);
    assert_eq!(first_wrong(base, 0..PAGES, 2), None, "the parent's own pages");
}

/// Pauses back to back, as a program forking children in a loop asks: a
/// pause that ends and the next asked before the parked handler wakes must
/// not leave it parked for ever (a Python program forking three children
/// in a row hung so).
#[test]
fn pauses_back_to_back_never_hang() {
    let Some((_store, region)) = region_filled() else { return };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(std::time::Duration::from_secs(60)).is_err() {
            eprintln!("pauses hung");
            std::process::abort();
        }
    });
    for round in 0..2000 {
        let paused = if round % 2 == 0 { region.pause() } else { region.pause_lazy() };
        drop(paused.unwrap());
    }
    done_tx.send(()).unwrap();
    watchdog.join().unwrap();
}
