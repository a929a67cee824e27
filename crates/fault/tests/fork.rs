//! fork of a process that owns a region whose pages do not fit its budget:
//! the parent's dirty pages are written out at the fork, so the child
//! shares none and reads every page as it was at the fork through its
//! parent, from a snapshot of the store, while the parent rewrites them all;
//! the parent's eviction copes with pages the fork had shared.

use memlend_fault::{serve_child, serve_link, ChildRegion, Discarded, LinkSource};
use memlend_fault::{Region, RegionConfig};
use memlend_store::layer::snapshot::{Owed, Snapshots};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
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

/// In the child: its own handler, then every page checked. The exit code
/// says what was wrong (0: nothing).
fn child(base: usize, in_store: Vec<u64>, link: UnixStream) -> i32 {
    let discarded = Arc::new(Discarded::new(PAGES as u32));
    let region = ChildRegion {
        base,
        pages: PAGES as u32,
        in_store,
        budget_pages: CHILD_BUDGET_PAGES,
        discarded: Arc::clone(&discarded),
    };
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
/// exit code, the pages sent to it and the old pages kept for it.
fn fork_and_serve(
    store: &Arc<Snapshots<RamStore>>,
    region: &Region,
    child: fn(usize, Vec<u64>, UnixStream) -> i32,
    meanwhile: impl FnOnce(),
) -> (i32, u64, u64) {
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
    drop(paused);
    let server = {
        let store = store.clone();
        std::thread::spawn(move || {
            let read = |page: u32, buf: &mut [u8]| {
                store.read_snapshot(snapshot, u64::from(page), buf).map_err(std::io::Error::other)
            };
            serve_link(parent_end, read, &std::sync::atomic::AtomicU64::new(0))
        })
    };
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

#[test]
fn a_forked_child_reads_the_region_as_it_was_while_the_parent_rewrites_it() {
    let Some((store, region)) = region_filled() else { return };
    let base = region.as_ptr() as usize;
    // Every page rewritten, shared ones and far ones, twice over the budget.
    let (code, sent, kept) = fork_and_serve(&store, &region, child, || fill(base, 0..PAGES, 2));
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
    assert!(h.pages_unshared > 0, "no shared page had to be unshared to move out");
    let resident = region.stats().pages_resident as usize;
    assert!(resident <= BUDGET_PAGES, "{resident} pages resident, budget {BUDGET_PAGES}");
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
    let region = ChildRegion {
        base,
        pages: PAGES as u32,
        in_store,
        budget_pages: CHILD_BUDGET_PAGES,
        discarded,
    };
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

#[test]
fn a_write_racing_the_forks_clean_waits_and_the_child_reads_the_fork_moment() {
    let Some((store, region)) = region_filled() else { return };
    let base = region.as_ptr() as usize;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A writer rewriting the first pages (resident, so it never waits on a
    // fault of its own), a new seed each pass, across the pause and the
    // fork: a page the clean wrote before its protection held would reach
    // the child with other bytes than it shares.
    let writer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut seed = 10;
            // Bounded: ends when the parent says so, a pass at a time.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fill(base, 0..HOT_PAGES, seed);
                seed += 1;
            }
            seed
        })
    };
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
