//! free(), munmap and madvise of region memory: `Region::discard` drops pages
//! for good (zero, no budget, nothing in the store); MADV_FREE neither loses
//! nor resurrects data; the owner unmapping part of a region leaves the rest
//! working; discards race with faults on other pages.

use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::layer::Stats;
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;

fn ram_store(pages: usize) -> Arc<Stats<RamStore>> {
    Arc::new(Stats::new(RamStore::new(pages as u64, RamOptions::default()).unwrap()))
}

fn region(pages: usize, budget_pages: usize, store: Arc<Stats<RamStore>>) -> Region {
    let config = RegionConfig {
        size_bytes: pages * PAGE_SIZE,
        budget_pages,
        evict_batch_pages: 8.min(budget_pages),
    };
    Region::new(config, store).unwrap()
}

/// A region whose resident set changes only on faults: no eviction ahead
/// of need, no prefetch, so a test can count resident pages exactly.
fn exact_region(pages: usize, budget_pages: usize, store: Arc<Stats<RamStore>>) -> Region {
    let config = RegionConfig { size_bytes: pages * PAGE_SIZE, budget_pages, evict_batch_pages: 8 };
    let tuning = Tuning { prefetch_pages_max: 0, low_water_pages: Some(0), ..Tuning::default() };
    Region::with_tuning(config, tuning, store).unwrap()
}

fn pattern(page: usize, word: usize, seed: u64) -> u64 {
    (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (word as u64) << 40 ^ seed | 1
}

/// Word `word` of page `page`, by pointer: threads share the region.
fn word(region: &Region, page: usize, word: usize) -> *mut u64 {
    assert!(page * PAGE_SIZE + word * 8 < region.len());
    (region.as_ptr() as usize + page * PAGE_SIZE + word * 8) as *mut u64
}

fn get(region: &Region, page: usize, w: usize) -> u64 {
    // SAFETY: an aligned word inside the live region; tests give each word
    // one writer at a time.
    unsafe { word(region, page, w).read_volatile() }
}

fn put(region: &Region, page: usize, w: usize, value: u64) {
    // SAFETY: as in `get`.
    unsafe { word(region, page, w).write_volatile(value) }
}

fn fill(region: &Region, pages: std::ops::Range<usize>, seed: u64) {
    for page in pages {
        (0..WORDS_PER_PAGE).for_each(|w| put(region, page, w, pattern(page, w, seed)));
    }
}

fn page_is(region: &Region, page: usize, want: impl Fn(usize) -> u64) -> bool {
    (0..WORDS_PER_PAGE).all(|w| get(region, page, w) == want(w))
}

#[test]
fn a_discarded_range_reads_zero_costs_nothing_and_leaves_the_store() {
    const PAGES: usize = 512;
    const BUDGET: usize = 64;
    let store = ram_store(PAGES);
    let region = exact_region(PAGES, BUDGET, store.clone());
    fill(&region, 0..PAGES, 1);
    // Now the last pages are resident (the budget less the handler's
    // buffers: 448.. or a little later), the rest in the store. Discard a
    // range of each kind, and one that straddles both (440..452 did before
    // the reserve; the assertions count either way).
    let first_resident = PAGES - (BUDGET - region.reserved_pages());
    let ranges = [100..140, 470..500, 440..452];
    let resident_discarded: u64 =
        ranges.iter().map(|r| r.clone().filter(|&p| p >= first_resident).count() as u64).sum();
    let before = region.detailed_stats();
    let resident_before = before.basic.pages_resident;
    for range in ranges.clone() {
        region.discard(range.start * PAGE_SIZE, range.len() * PAGE_SIZE).unwrap();
    }
    let after = region.detailed_stats();
    assert_eq!(resident_before as usize, PAGES - first_resident, "{before:?}");
    assert_eq!(after.basic.pages_resident, resident_before - resident_discarded, "{after:?}");
    assert_eq!(after.remove_events - before.remove_events, 3, "{after:?}");
    assert_eq!(after.pages_discarded - before.pages_discarded, 82, "{after:?}");
    let io = store.snapshot();
    assert_eq!(io.discard.pages, 82, "{io:?}");
    assert_eq!(io.discard.ops, 3, "one store call per range: {io:?}");
    let discarded = |page: usize| ranges.iter().any(|r| r.contains(&page));
    let reads_before = store.snapshot().read.pages;
    for page in 0..PAGES {
        if discarded(page) {
            assert!(page_is(&region, page, |_| 0), "page {page} not zero");
        } else {
            assert!(page_is(&region, page, |w| pattern(page, w, 1)), "page {page} lost");
        }
    }
    let stats = region.stats();
    let read_pages = store.snapshot().read.pages - reads_before;
    assert!(read_pages <= (PAGES - 82) as u64, "discarded pages not read: {stats:?}");
    assert!(stats.pages_resident <= BUDGET as u64, "{stats:?}");
}

#[test]
fn discard_refuses_ranges_outside_or_unaligned() {
    let region = region(16, 4, ram_store(16));
    assert!(region.discard(1, PAGE_SIZE).is_err());
    assert!(region.discard(0, 100).is_err());
    assert!(region.discard(15 * PAGE_SIZE, 2 * PAGE_SIZE).is_err());
    assert!(region.discard(usize::MAX - PAGE_SIZE + 1, PAGE_SIZE).is_err());
    region.discard(16 * PAGE_SIZE, 0).unwrap();
    region.discard(0, 16 * PAGE_SIZE).unwrap();
}

#[test]
fn a_discarded_page_written_again_keeps_the_new_bytes() {
    const PAGES: usize = 256;
    let store = ram_store(PAGES);
    let region = region(PAGES, 16, store);
    fill(&region, 0..PAGES, 2);
    region.discard(10 * PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
    fill(&region, 10..12, 3);
    fill(&region, 100..200, 2); // evict them again
    for page in 0..PAGES {
        let want = match page {
            10 | 11 => pattern(page, 0, 3),
            12 | 13 => 0,
            _ => pattern(page, 0, 2),
        };
        assert_eq!(get(&region, page, 0), want, "page {page}");
    }
}

/// MADV_FREE leaves a page mapped until the kernel reclaims it, and a write
/// cancels the free: every word must read its old value or zero, a word
/// written afterwards must keep its new value through eviction, and no
/// older store copy may come back. A write to a clean (write-protected)
/// page must not leave the writer faulting for ever.
#[test]
fn madv_free_neither_loses_nor_resurrects() {
    const PAGES: usize = 256;
    const BUDGET: usize = 32;
    let store = ram_store(PAGES);
    let region = region(PAGES, BUDGET, store.clone());
    fill(&region, 0..PAGES, 4); // pages 224.. resident and dirty
    fill(&region, 0..16, 5); // an older copy of 0..16 in the store after this
    (100..110).for_each(|page| assert_eq!(get(&region, page, 0), pattern(page, 0, 4)));
    // Pages 100..110 are resident and clean; 0..16 dirty; 200..210 in store.
    let ranges = [0..16, 100..110, 200..210];
    for r in &ranges {
        let ptr = word(&region, r.start, 0).cast();
        // SAFETY: whole pages inside the live region; MADV_FREE only lets
        // the kernel drop their contents.
        assert_eq!(unsafe { libc::madvise(ptr, r.len() * PAGE_SIZE, libc::MADV_FREE) }, 0);
    }
    let freed = |page: usize| ranges.iter().any(|r| r.contains(&page));
    let seed = |page: usize| if page < 16 { 5 } else { 4 };
    for page in (0..PAGES).filter(|&p| freed(p)) {
        for w in 0..WORDS_PER_PAGE {
            let got = get(&region, page, w);
            assert!(got == 0 || got == pattern(page, w, seed(page)), "page {page} word {w}");
        }
        put(&region, page, 0, 0xF00D + page as u64);
    }
    fill(&region, 120..200, 4); // evict everything else
    for page in 0..PAGES {
        for w in 0..WORDS_PER_PAGE {
            let got = get(&region, page, w);
            if !freed(page) {
                assert_eq!(got, pattern(page, w, seed(page)), "page {page} word {w}");
            } else if w == 0 {
                assert_eq!(got, 0xF00D + page as u64, "page {page}: write after free lost");
            } else {
                assert!(got == 0 || got == pattern(page, w, seed(page)), "page {page} word {w}");
            }
        }
    }
    assert!(region.stats().pages_resident <= BUDGET as u64 + 8, "{:?}", region.stats());
}

/// The owner unmaps part of the region (an UNMAP event); faults, eviction
/// and patterns elsewhere go on as before, and dropping the region works.
#[test]
fn unmapping_part_of_a_region_leaves_the_rest_working() {
    const PAGES: usize = 512;
    let store = ram_store(PAGES);
    let region = region(PAGES, 32, store.clone());
    fill(&region, 0..PAGES, 6);
    let hole = 200..300;
    let hole_ptr = word(&region, hole.start, 0).cast();
    let hole_bytes = hole.len() * PAGE_SIZE;
    // SAFETY: whole pages inside the live region, which no other thread
    // touches; nothing is accessed in the hole afterwards.
    assert_eq!(unsafe { libc::munmap(hole_ptr, hole_bytes) }, 0);
    // munmap returns once the handler has read the event, maybe before it
    // has dealt with it.
    for _ in 0..1000 {
        if store.snapshot().discard.pages > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let stats = region.detailed_stats();
    assert_eq!(stats.unmap_events, 1, "{stats:?}");
    assert_eq!(store.snapshot().discard.pages, hole.len() as u64);
    for _ in 0..2 {
        for page in (0..PAGES).filter(|p| !hole.contains(p)) {
            assert!(page_is(&region, page, |w| pattern(page, w, 6)), "page {page}");
        }
    }
    assert!(region.stats().pages_resident <= 32, "{:?}", region.stats());
    // Hold the hole so no other test's mapping lands there before the
    // region's drop unmaps its whole range.
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: a fresh anonymous mapping in the hole, which nothing uses.
    let got = unsafe { libc::mmap(hole_ptr, hole_bytes, libc::PROT_READ, flags, -1, 0) };
    if got == hole_ptr {
        drop(region);
    } else {
        std::mem::forget(region); // something else lives there now
    }
}

/// Four threads write and check their own blocks of pages, under heavy
/// eviction, while a fifth repeatedly writes, discards and rewrites blocks
/// of its own.
#[test]
fn discards_race_with_faults_elsewhere() {
    const PAGES: usize = 1024;
    const BLOCK: usize = 8;
    const WORKERS: usize = 4;
    let store = ram_store(PAGES);
    let region = region(PAGES, 64, store.clone());
    let owner = |page: usize| (page / BLOCK) % (WORKERS + 1);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for t in 0..WORKERS {
            let (region, done) = (&region, &done);
            scope.spawn(move || {
                let mine: Vec<usize> = (0..PAGES).filter(|&p| owner(p) == t).collect();
                for round in 0..6u64 {
                    mine.iter().for_each(|&p| put(region, p, t, pattern(p, t, round)));
                    for &p in &mine {
                        assert_eq!(get(region, p, t), pattern(p, t, round), "page {p}");
                    }
                }
                done.store(true, Relaxed);
            });
        }
        let blocks: Vec<usize> =
            (0..PAGES / BLOCK).filter(|&b| owner(b * BLOCK) == WORKERS).collect();
        let mut rounds = 0;
        while !done.load(Relaxed) && rounds < 10_000 {
            let block = blocks[rounds % blocks.len()];
            let pages = block * BLOCK..(block + 1) * BLOCK;
            fill(&region, pages.clone(), 9);
            region.discard(pages.start * PAGE_SIZE, BLOCK * PAGE_SIZE).unwrap();
            for page in pages.clone() {
                assert!(page_is(&region, page, |_| 0), "discarded page {page}");
            }
            fill(&region, pages.clone(), 10);
            for page in pages {
                assert!(page_is(&region, page, |w| pattern(page, w, 10)), "page {page}");
            }
            rounds += 1;
        }
        assert!(rounds > 0);
    });
    let stats = region.detailed_stats();
    eprintln!("{stats:?}");
    assert!(stats.basic.pages_resident <= 64, "{stats:?}");
    assert!(stats.remove_events > 0, "{stats:?}");
}

#[test]
fn regions_are_shared_between_threads() {
    fn send_and_sync<T: Send + Sync>(_: &T) {}
    send_and_sync(&region(4, 4, ram_store(4)));
}
