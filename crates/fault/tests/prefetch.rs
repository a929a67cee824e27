//! Prefetch on a real region: a sequential scan is read ahead in growing
//! windows, a strided one too, random access gets none, and patterns
//! survive scans with prefetch on. `measure_sequential_scan` (ignored)
//! prints faults/s and pages/s before and after, over a RamStore and a
//! FileStore.

use memlend_fault::{DetailedStats, Region, RegionConfig, Tuning};
use memlend_store::file::{FileOptions, FileStore};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::sync::Arc;
use std::time::Instant;

fn ram_store(pages: usize) -> Arc<dyn PageStore> {
    Arc::new(RamStore::new(pages as u64, RamOptions::default()).unwrap())
}

fn region(pages: usize, budget_pages: usize, prefetch: bool, store: Arc<dyn PageStore>) -> Region {
    let config =
        RegionConfig { size_bytes: pages * PAGE_SIZE, budget_pages, evict_batch_pages: 32 };
    let prefetch_max_pages = if prefetch { Tuning::default().prefetch_max_pages } else { 0 };
    Region::with_tuning(config, Tuning { prefetch_max_pages, ..Tuning::default() }, store).unwrap()
}

fn word(region: &Region, page: usize) -> *mut u64 {
    assert!(page * PAGE_SIZE < region.len());
    (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64
}

fn value(page: usize, seed: u64) -> u64 {
    (page as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed
}

/// Write one word per page in `order`, with `seed`.
fn write_pages(region: &Region, order: impl Iterator<Item = usize>, seed: u64) {
    // SAFETY: an aligned word inside the live region; one thread.
    order.for_each(|page| unsafe { word(region, page).write_volatile(value(page, seed)) });
}

/// Check one word per page in `order`.
fn check_pages(region: &Region, order: impl Iterator<Item = usize>, seed: u64) {
    for page in order {
        // SAFETY: as in `write_pages`.
        let got = unsafe { word(region, page).read_volatile() };
        assert_eq!(got, value(page, seed), "page {page}");
    }
}

/// Fill every page, then time one read pass in `order`; the stats of the
/// pass alone and its seconds.
fn read_pass(region: &Region, order: impl Iterator<Item = usize> + Clone) -> (DetailedStats, f64) {
    let pages = region.len() / PAGE_SIZE;
    write_pages(region, 0..pages, 1);
    let before = region.detailed_stats();
    let start = Instant::now();
    check_pages(region, order, 1);
    let secs = start.elapsed().as_secs_f64();
    (minus(region.detailed_stats(), before), secs)
}

fn minus(a: DetailedStats, b: DetailedStats) -> DetailedStats {
    DetailedStats {
        basic: memlend_fault::RegionStats {
            faults_zero_filled: a.basic.faults_zero_filled - b.basic.faults_zero_filled,
            faults_from_store: a.basic.faults_from_store - b.basic.faults_from_store,
            faults_write_protect: a.basic.faults_write_protect - b.basic.faults_write_protect,
            ..a.basic
        },
        pages_prefetched: a.pages_prefetched - b.pages_prefetched,
        prefetch_hits: a.prefetch_hits - b.prefetch_hits,
        prefetch_wasted: a.prefetch_wasted - b.prefetch_wasted,
        ..a
    }
}

const PAGES: usize = 16_384;
const BUDGET_PAGES: usize = PAGES / 4;

#[test]
fn a_sequential_scan_is_read_ahead() {
    let region = region(PAGES, BUDGET_PAGES, true, ram_store(PAGES));
    let (pass, secs) = read_pass(&region, 0..PAGES);
    eprintln!("sequential, prefetch: {secs:.3} s, {pass:?}");
    let faults = pass.basic.faults_from_store;
    assert!(faults < PAGES as u64 / 20, "{faults} store faults: {pass:?}");
    assert!(pass.pages_prefetched + faults >= PAGES as u64 - BUDGET_PAGES as u64, "{pass:?}");
    assert!(pass.prefetch_hits * 10 >= pass.pages_prefetched * 9, "{pass:?}");
    assert!(pass.basic.pages_resident <= BUDGET_PAGES as u64, "{pass:?}");
}

#[test]
fn a_strided_or_backward_scan_is_read_ahead() {
    for (stride, backward) in [(3, false), (1, true)] {
        let region = region(PAGES, BUDGET_PAGES, true, ram_store(PAGES));
        let forward = (0..PAGES).step_by(stride);
        let order: Vec<usize> = if backward { forward.rev().collect() } else { forward.collect() };
        let touched = order.len() as u64;
        let (pass, _) = read_pass(&region, order.into_iter());
        eprintln!("stride {stride}, backward {backward}: {pass:?}");
        assert!(pass.basic.faults_from_store < touched / 10, "{pass:?}");
    }
}

#[test]
fn random_access_gets_no_prefetch() {
    let region = region(PAGES, BUDGET_PAGES, true, ram_store(PAGES));
    let mut x = 0x853c_49e6_748f_ea9bu64;
    let order: Vec<usize> = (0..PAGES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % PAGES as u64) as usize
        })
        .collect();
    let (pass, _) = read_pass(&region, order.into_iter());
    eprintln!("random: {pass:?}");
    assert!(pass.basic.faults_from_store > PAGES as u64 / 2, "{pass:?}");
    assert!(pass.pages_prefetched * 100 <= pass.basic.faults_from_store, "{pass:?}");
}

/// Writes and reads in sequence and backwards, with prefetch mapping pages
/// write-protected under the writer: every page keeps its latest value.
#[test]
fn patterns_survive_scans_with_prefetch() {
    let region = region(PAGES, BUDGET_PAGES, true, ram_store(PAGES));
    write_pages(&region, 0..PAGES, 1);
    check_pages(&region, 0..PAGES, 1);
    write_pages(&region, (0..PAGES).rev(), 2);
    check_pages(&region, 0..PAGES, 2);
    write_pages(&region, (0..PAGES).step_by(2), 3);
    for page in 0..PAGES {
        check_pages(&region, page..page + 1, if page % 2 == 0 { 3 } else { 2 });
    }
    let stats = region.detailed_stats();
    eprintln!("{stats:?}");
    assert!(stats.pages_prefetched > 0, "{stats:?}");
    assert!(stats.basic.pages_resident <= BUDGET_PAGES as u64, "{stats:?}");
}

fn scan(name: &str, store: Arc<dyn PageStore>, prefetch: bool) {
    let region = region(PAGES, BUDGET_PAGES, prefetch, store);
    let (pass, secs) = read_pass(&region, 0..PAGES);
    let faults = pass.basic.faults_from_store + pass.basic.faults_zero_filled;
    eprintln!(
        "{name:5} prefetch {prefetch:5}: {secs:.3} s, {:>7.0} pages/s, {:>6} faults ({:>7.0}/s), \
         {} prefetched, {} hits, {} wasted",
        PAGES as f64 / secs,
        faults,
        faults as f64 / secs,
        pass.pages_prefetched,
        pass.prefetch_hits,
        pass.prefetch_wasted,
    );
}

/// Sequential read scan of a region 4x its budget, every page in the
/// store first; run with `--ignored --nocapture`.
#[test]
#[ignore = "measurement"]
fn measure_sequential_scan() {
    let dir = std::env::temp_dir().join(format!("memlend-prefetch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for prefetch in [false, true] {
        scan("ram", ram_store(PAGES), prefetch);
        let path = dir.join("store");
        let file = FileStore::create(&path, PAGES as u64, FileOptions::default()).unwrap();
        scan("file", Arc::new(file), prefetch);
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_dir(&dir).unwrap();
}
