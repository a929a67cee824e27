//! Regions over real userfaultfd and real bytes: patterns survive eviction,
//! untouched pages cost no store I/O, threads race on pages, drop stops.

use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::layer::Stats;
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;

fn ram_store(pages: usize) -> Arc<Stats<RamStore>> {
    let ram = RamStore::new(pages as u64, RamOptions::default()).unwrap();
    Arc::new(Stats::new(ram))
}

/// A region without prefetch or eviction ahead of need: these tests count
/// the faults of each access and which pages are resident (tests/prefetch.rs
/// and tests/ahead.rs turn those on).
fn region(size_bytes: usize, budget_pages: usize, store: Arc<dyn PageStore>) -> Region {
    let config = RegionConfig { size_bytes, budget_pages, evict_batch_pages: 32.min(budget_pages) };
    let tuning = Tuning { prefetch_pages_max: 0, low_water_pages: Some(0), ..Tuning::default() };
    Region::with_tuning(config, tuning, store).unwrap()
}

/// The region as words. Threads that share a region touch disjoint words
/// through `word_ptr` instead.
fn words(region: &mut Region) -> &mut [u64] {
    // SAFETY: the region is a live, writable, page-aligned mapping of
    // `len()` bytes for as long as `region` is borrowed, and the exclusive
    // borrow keeps this the only view.
    unsafe { std::slice::from_raw_parts_mut(region.as_ptr().cast(), region.len() / 8) }
}

fn word_ptr(base: usize, page: usize, word: usize) -> *mut u64 {
    (base + page * PAGE_SIZE + word * 8) as *mut u64
}

fn pattern(page: usize, word: usize, seed: u64) -> u64 {
    (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (word as u64) << 40 ^ seed
}

#[test]
fn patterns_survive_heavy_eviction() {
    const SIZE: usize = 64 << 20;
    const BUDGET_PAGES: usize = (4 << 20) / PAGE_SIZE;
    let pages = SIZE / PAGE_SIZE;
    let store = ram_store(pages);
    let mut region = region(SIZE, BUDGET_PAGES, store.clone());

    let start = Instant::now();
    for (page, chunk) in words(&mut region).chunks_mut(WORDS_PER_PAGE).enumerate() {
        for (word, w) in chunk.iter_mut().enumerate() {
            *w = pattern(page, word, 1);
        }
    }
    let write_s = start.elapsed().as_secs_f64();
    let after_write = region.stats();

    let start = Instant::now();
    for (page, chunk) in words(&mut region).chunks(WORDS_PER_PAGE).enumerate() {
        for (word, &w) in chunk.iter().enumerate() {
            assert_eq!(w, pattern(page, word, 1), "page {page} word {word}");
        }
    }
    let read_s = start.elapsed().as_secs_f64();
    let stats = region.stats();
    let from_store = stats.faults_from_store - after_write.faults_from_store;
    eprintln!(
        "write pass: {:.0} zero-fill faults/s; read pass: {:.0} store faults/s; {stats:?}",
        after_write.faults_zero_filled as f64 / write_s,
        from_store as f64 / read_s,
    );
    assert!(stats.pages_resident <= BUDGET_PAGES as u64, "{stats:?}");
    assert!(stats.eviction_batches > 0, "{stats:?}");
    assert!(from_store as usize >= pages - BUDGET_PAGES, "{stats:?}");
    assert_eq!(stats.faults_zero_filled as usize, pages, "{stats:?}");
    assert_eq!(stats.pages_poisoned, 0);
    let io = store.snapshot();
    assert_eq!(io.read.pages, stats.faults_from_store);
    assert_eq!(io.write.pages, stats.pages_written_back);
    assert!(io.write.ops <= stats.eviction_batches, "one write per batch");
}

#[test]
fn untouched_pages_read_zero_without_store_reads() {
    const SIZE: usize = 16 << 20;
    let store = ram_store(SIZE / PAGE_SIZE);
    let mut region = region(SIZE, 256, store.clone());
    let nonzero = words(&mut region).iter().filter(|&&w| w != 0).count();
    assert_eq!(nonzero, 0);
    let stats = region.stats();
    assert_eq!(stats.faults_zero_filled as usize, SIZE / PAGE_SIZE, "{stats:?}");
    assert_eq!(store.snapshot().read.ops, 0, "{stats:?}");
    assert_eq!(stats.faults_from_store, 0);
}

/// Each of `threads` threads writes its own words of every page in `pages`,
/// then checks them. With `overlap`, all threads share every page (word
/// `w` belongs to thread `w % threads`); without, each owns every
/// `threads`-th page.
fn race(threads: usize, pages: usize, overlap: bool) {
    let store = ram_store(pages);
    let mut region = region(pages * PAGE_SIZE, 64, store);
    let base = region.as_ptr() as usize;
    let mine = |t: usize, page: usize, word: usize| {
        if overlap {
            word % threads == t
        } else {
            page % threads == t
        }
    };
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                for pass in 0..2 {
                    for page in 0..pages {
                        for word in (0..WORDS_PER_PAGE).filter(|&w| mine(t, page, w)) {
                            let ptr = word_ptr(base, page, word);
                            let want = pattern(page, word, t as u64);
                            // SAFETY: `ptr` is an aligned word inside the live
                            // region, and only thread `t` accesses this word.
                            unsafe {
                                if pass == 0 {
                                    ptr.write_volatile(want);
                                } else {
                                    assert_eq!(ptr.read_volatile(), want, "page {page}");
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    for (page, chunk) in words(&mut region).chunks(WORDS_PER_PAGE).enumerate() {
        for (word, &w) in chunk.iter().enumerate() {
            let owner = (0..threads).find(|&t| mine(t, page, word)).unwrap();
            assert_eq!(w, pattern(page, word, owner as u64), "page {page} word {word}");
        }
    }
    let stats = region.stats();
    assert!(stats.pages_resident <= 64, "{stats:?}");
    assert!(stats.faults_from_store > 0, "{stats:?}");
}

#[test]
fn threads_on_disjoint_pages() {
    race(4, 2048, false);
}

#[test]
fn threads_on_shared_pages() {
    race(4, 1024, true);
}

/// Two threads increment their own word of a few hot pages in a tight loop
/// while a third sweeps the rest of the region, so FIFO keeps evicting the
/// hot pages under the writers. An eviction that copied a page out and then
/// dropped it would lose the increments landing in between.
#[test]
fn no_write_lost_to_eviction() {
    const WRITERS: usize = 2;
    const HOT_PAGES: usize = 4;
    const PAGES: usize = 512;
    const SWEEP_FAULTS: usize = 4 * PAGES;
    let mut region = region(PAGES * PAGE_SIZE, 64, ram_store(PAGES));
    let base = region.as_ptr() as usize;
    let swept = AtomicBool::new(false);
    let rounds: Vec<u64> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|t| {
                let swept = &swept;
                scope.spawn(move || {
                    let mut rounds = 0;
                    while !swept.load(Relaxed) && rounds < 1 << 30 {
                        for page in 0..HOT_PAGES {
                            let ptr = word_ptr(base, page, t);
                            // SAFETY: an aligned word inside the live region
                            // that only thread `t` accesses.
                            unsafe { ptr.write_volatile(ptr.read_volatile() + 1) };
                        }
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        for fault in 0..SWEEP_FAULTS {
            let page = HOT_PAGES + fault % (PAGES - HOT_PAGES);
            // SAFETY: an aligned word inside the live region that only this
            // (the sweeping) thread accesses.
            unsafe { word_ptr(base, page, WRITERS).write_volatile(1) };
        }
        swept.store(true, Relaxed);
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let stats = region.stats();
    for (page, chunk) in words(&mut region).chunks(WORDS_PER_PAGE).take(HOT_PAGES).enumerate() {
        assert_eq!(chunk[..WRITERS], rounds[..], "page {page}, {stats:?}");
    }
    // Each hot page was evicted and faulted back many times meanwhile.
    assert!(stats.faults_from_store > 10 * HOT_PAGES as u64, "{stats:?}");
}

#[test]
fn drop_when_idle_stops_the_handler() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut region = region(1 << 20, 16, ram_store(256));
        words(&mut region)[0] = 7;
        std::thread::sleep(Duration::from_millis(50));
        drop(region);
        done_tx.send(()).unwrap();
    });
    done_rx.recv_timeout(Duration::from_secs(10)).expect("dropping an idle region did not return");
}

#[test]
fn bad_configs_are_refused() {
    let store: Arc<dyn PageStore> = ram_store(16);
    let bad = [(0, 4, 1), (4097, 4, 1), (PAGE_SIZE, 0, 1), (PAGE_SIZE, 4, 5)];
    for (size_bytes, budget_pages, evict_batch_pages) in bad {
        let config = RegionConfig { size_bytes, budget_pages, evict_batch_pages };
        assert!(Region::new(config, store.clone()).is_err());
    }
    let too_big =
        RegionConfig { size_bytes: 17 * PAGE_SIZE, budget_pages: 4, evict_batch_pages: 1 };
    assert!(Region::new(too_big, store).is_err(), "store smaller than region");
}

#[test]
fn evicted_zero_pages_are_dropped_not_written() {
    let pages = 1024;
    let store = ram_store(pages);
    let mut region = region(pages * PAGE_SIZE, 64, store.clone());
    // Write faults give each page its own zeroed copy; nothing non-zero is
    // ever stored, so eviction has nothing to write.
    for chunk in words(&mut region).chunks_mut(WORDS_PER_PAGE) {
        chunk[0] = 0;
    }
    assert!(words(&mut region).iter().all(|&w| w == 0));
    let stats = region.stats();
    assert!(stats.pages_zero_dropped >= (pages - 64) as u64, "{stats:?}");
    assert_eq!(stats.pages_written_back, 0, "{stats:?}");
    assert_eq!(store.snapshot().write.pages, 0);
    assert_eq!(store.snapshot().read.ops, 0, "zero pages come back without store reads");
}

#[test]
fn a_page_zeroed_after_it_was_stored_reads_zero_not_the_stale_copy() {
    let pages = 512;
    let store = ram_store(pages);
    let mut region = region(pages * PAGE_SIZE, 32, store.clone());
    for (page, chunk) in words(&mut region).chunks_mut(WORDS_PER_PAGE).enumerate() {
        chunk.iter_mut().enumerate().for_each(|(word, w)| *w = pattern(page, word, 7));
    }
    // Page 3 went to the store with data; now it is cleared and evicted
    // again as zeroes, so the store's copy is stale and must never return.
    words(&mut region)[3 * WORDS_PER_PAGE..4 * WORDS_PER_PAGE].fill(0);
    for chunk in words(&mut region).chunks(WORDS_PER_PAGE).skip(100).take(100) {
        assert_ne!(chunk[0], 1, "touch other pages to evict page 3");
    }
    for (page, chunk) in words(&mut region).chunks(WORDS_PER_PAGE).enumerate() {
        for (word, &w) in chunk.iter().enumerate() {
            let want = if page == 3 { 0 } else { pattern(page, word, 7) };
            assert_eq!(w, want, "page {page} word {word}");
        }
    }
    assert!(region.stats().pages_zero_dropped >= 1, "{:?}", region.stats());
}

/// Fill every page of the region with pattern `seed`.
fn fill(region: &mut Region, seed: u64) {
    for (page, chunk) in words(region).chunks_mut(WORDS_PER_PAGE).enumerate() {
        chunk.iter_mut().enumerate().for_each(|(word, w)| *w = pattern(page, word, seed));
    }
}

/// Check every word of every page against `want(page, word)`.
fn check(region: &mut Region, want: impl Fn(usize, usize) -> u64) {
    for (page, chunk) in words(region).chunks(WORDS_PER_PAGE).enumerate() {
        for (word, &w) in chunk.iter().enumerate() {
            assert_eq!(w, want(page, word), "page {page} word {word}");
        }
    }
}

/// Read one word of each of `pages` (to fault them in or evict others).
fn touch(region: &mut Region, pages: impl Iterator<Item = usize>) {
    for page in pages {
        std::hint::black_box(words(region)[page * WORDS_PER_PAGE]);
    }
}

#[test]
fn read_mostly_pages_are_not_written_back_again() {
    const BUDGET_PAGES: usize = 1024;
    const PAGES: usize = 4 * BUDGET_PAGES;
    let store = ram_store(PAGES);
    let mut region = region(PAGES * PAGE_SIZE, BUDGET_PAGES, store.clone());
    fill(&mut region, 11);
    // The first read pass evicts the pages the writes left dirty.
    let start = Instant::now();
    check(&mut region, |page, word| pattern(page, word, 11));
    let first_s = start.elapsed().as_secs_f64();
    let before = region.stats();
    let io_before = store.snapshot();
    let start = Instant::now();
    check(&mut region, |page, word| pattern(page, word, 11));
    let second_s = start.elapsed().as_secs_f64();
    let after = region.stats();
    let io_after = store.snapshot();
    eprintln!("read passes: {first_s:.3} s (dirty victims), {second_s:.3} s (clean); {after:?}");
    let written = after.pages_written_back - before.pages_written_back;
    let clean = after.pages_clean_dropped - before.pages_clean_dropped;
    assert!(written <= 32, "{written} pages written back: {after:?}");
    assert!(io_after.write.pages - io_before.write.pages <= 32, "{io_after:?}");
    assert!(clean >= (PAGES - BUDGET_PAGES) as u64, "{after:?}");
    assert!(after.pages_resident <= BUDGET_PAGES as u64, "clean pages moved out: {after:?}");
    assert_eq!(after.faults_write_protect, 0, "reads raise no WP faults: {after:?}");
}

#[test]
fn a_clean_page_written_then_evicted_keeps_the_write() {
    const PAGES: usize = 512;
    const PAGE: usize = 5;
    let mut region = region(PAGES * PAGE_SIZE, 32, ram_store(PAGES));
    fill(&mut region, 3);
    touch(&mut region, 100..200);
    // Back from the store clean (a read), then written: a WP fault.
    assert_eq!(words(&mut region)[PAGE * WORDS_PER_PAGE], pattern(PAGE, 0, 3));
    let before = region.stats();
    words(&mut region)[PAGE * WORDS_PER_PAGE + 9] = 0xD1D7;
    assert_eq!(region.stats().faults_write_protect, before.faults_write_protect + 1);
    touch(&mut region, 100..200);
    let stats = region.stats();
    assert!(stats.faults_from_store > before.faults_from_store, "page evicted: {stats:?}");
    check(&mut region, |page, word| match (page, word) {
        (PAGE, 9) => 0xD1D7,
        _ => pattern(page, word, 3),
    });
}

#[test]
fn a_page_read_as_zero_then_written_keeps_the_write() {
    const PAGES: usize = 512;
    const PAGE: usize = 7;
    let store = ram_store(PAGES);
    let mut region = region(PAGES * PAGE_SIZE, 32, store.clone());
    // A read maps the shared zero page; the write after it is a
    // copy-on-write that userfaultfd does not report.
    assert_eq!(words(&mut region)[PAGE * WORDS_PER_PAGE], 0);
    let page = PAGE * WORDS_PER_PAGE..(PAGE + 1) * WORDS_PER_PAGE;
    words(&mut region)[page].iter_mut().enumerate().for_each(|(w, v)| *v = pattern(PAGE, w, 5));
    touch(&mut region, 100..200);
    // Write-backs run on their own thread and are counted when the handler
    // settles them; until then a fault on the page is served from its
    // staging copy, not the store (CI once read the counter too early).
    let deadline = Instant::now() + Duration::from_secs(10);
    while region.stats().pages_written_back == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = region.stats();
    assert!(stats.pages_written_back >= 1, "page {PAGE} evicted with its data: {stats:?}");
    check(&mut region, |page, word| if page == PAGE { pattern(PAGE, word, 5) } else { 0 });
    assert_eq!(store.snapshot().read.pages, 1, "only page {PAGE} came from the store");
}

/// Writes to resident clean pages: each one WP fault, nothing else.
#[test]
fn writes_to_clean_pages_cost_one_wp_fault_each() {
    const BUDGET_PAGES: usize = 4096;
    const PAGES: usize = 4 * BUDGET_PAGES;
    let mut region = region(PAGES * PAGE_SIZE, BUDGET_PAGES, ram_store(PAGES));
    fill(&mut region, 9);
    check(&mut region, |page, word| pattern(page, word, 9));
    // Now the last pages are resident and clean: the budget less the
    // handler's buffers (`reserved_pages`).
    let before = region.stats();
    let mapped = before.pages_resident as usize;
    assert!(mapped >= BUDGET_PAGES - region.reserved_pages() - 64, "{before:?}");
    let start = Instant::now();
    for page in PAGES - mapped..PAGES {
        words(&mut region)[page * WORDS_PER_PAGE] = 1;
    }
    let write_s = start.elapsed().as_secs_f64();
    let after = region.stats();
    eprintln!("{:.0} WP faults/s, {after:?}", mapped as f64 / write_s);
    assert_eq!(after.faults_write_protect - before.faults_write_protect, mapped as u64);
    assert_eq!(after.faults_from_store, before.faults_from_store, "{after:?}");
    assert_eq!(after.eviction_batches, before.eviction_batches, "{after:?}");
    check(&mut region, |page, word| match (page >= PAGES - mapped, word) {
        (true, 0) => 1,
        _ => pattern(page, word, 9),
    });
}

/// A clean (write-protected) page is moved out by eviction; the write that
/// brings it back maps it writable with no WP fault: UFFDIO_MOVE leaves no
/// uffd-wp bit or marker behind at the source.
#[test]
fn a_clean_page_moved_out_comes_back_writable_on_a_write() {
    const PAGES: usize = 512;
    const PAGE: usize = 5;
    let mut region = region(PAGES * PAGE_SIZE, 32, ram_store(PAGES));
    fill(&mut region, 4);
    touch(&mut region, 100..200);
    touch(&mut region, PAGE..PAGE + 1);
    let read_back = region.stats();
    touch(&mut region, 100..200);
    let moved = region.stats();
    assert!(moved.pages_clean_dropped > read_back.pages_clean_dropped, "{moved:?}");
    words(&mut region)[PAGE * WORDS_PER_PAGE] = 0xBEEF;
    let written = region.stats();
    assert_eq!(written.faults_from_store, moved.faults_from_store + 1, "{written:?}");
    assert_eq!(written.faults_write_protect, moved.faults_write_protect, "{written:?}");
    touch(&mut region, 100..200);
    assert!(region.stats().pages_written_back > written.pages_written_back);
    check(&mut region, |page, word| match (page, word) {
        (PAGE, 0) => 0xBEEF,
        _ => pattern(page, word, 4),
    });
}

/// The owner drops a clean page (MADV_DONTNEED): it reads as zero, and a
/// write to that zero page, which userfaultfd does not see, is kept.
#[test]
fn a_clean_page_dropped_by_the_owner_reads_zero_and_keeps_a_later_write() {
    const PAGES: usize = 512;
    const PAGE: usize = 5;
    let mut region = region(PAGES * PAGE_SIZE, 32, ram_store(PAGES));
    fill(&mut region, 6);
    touch(&mut region, 100..200);
    touch(&mut region, PAGE..PAGE + 1);
    let page_ptr = words(&mut region)[PAGE * WORDS_PER_PAGE..].as_mut_ptr();
    // SAFETY: one whole page inside the live region, which no other thread
    // touches; MADV_DONTNEED on anonymous memory only drops its contents.
    let rc = unsafe { libc::madvise(page_ptr.cast(), PAGE_SIZE, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
    assert_eq!(words(&mut region)[PAGE * WORDS_PER_PAGE + 1], 0);
    words(&mut region)[PAGE * WORDS_PER_PAGE] = 0x77;
    touch(&mut region, 100..200);
    check(&mut region, |page, word| match (page, word) {
        (PAGE, 0) => 0x77,
        (PAGE, _) => 0,
        _ => pattern(page, word, 6),
    });
}
