//! Prefetch on a real region: a sequential scan is read ahead in growing
//! windows, a strided one too, random access gets none, and patterns
//! survive scans with prefetch on. `measure_sequential_scan` (ignored)
//! prints faults/s and pages/s before and after, over a RamStore and a
//! FileStore.

use memlend_fault::{Region, RegionConfig, Tuning};
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
    let prefetch_pages_max = if prefetch { Tuning::default().prefetch_pages_max } else { 0 };
    Region::with_tuning(config, Tuning { prefetch_pages_max, ..Tuning::default() }, store).unwrap()
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

/// What one pass cost: counters as differences over the pass.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
struct Pass {
    faults_from_store: u64,
    faults_zero_filled: u64,
    pages_resident: u64,
    pages_prefetched: u64,
    prefetch_hits: u64,
    prefetch_wasted: u64,
}

fn snapshot(region: &Region) -> Pass {
    let (basic, handler) = (region.stats(), region.handler_stats());
    Pass {
        faults_from_store: basic.faults_from_store,
        faults_zero_filled: basic.faults_zero_filled,
        pages_resident: basic.pages_resident,
        pages_prefetched: handler.pages_prefetched,
        prefetch_hits: handler.prefetch_hits,
        prefetch_wasted: handler.prefetch_wasted,
    }
}

/// Fill every page, then time one read pass in `order`; the counters of
/// the pass alone and its seconds.
fn read_pass(region: &Region, order: impl Iterator<Item = usize>) -> (Pass, f64) {
    let pages = region.len() / PAGE_SIZE;
    write_pages(region, 0..pages, 1);
    let before = snapshot(region);
    let start = Instant::now();
    check_pages(region, order, 1);
    let secs = start.elapsed().as_secs_f64();
    let after = snapshot(region);
    let pass = Pass {
        faults_from_store: after.faults_from_store - before.faults_from_store,
        faults_zero_filled: after.faults_zero_filled - before.faults_zero_filled,
        pages_resident: after.pages_resident,
        pages_prefetched: after.pages_prefetched - before.pages_prefetched,
        prefetch_hits: after.prefetch_hits - before.prefetch_hits,
        prefetch_wasted: after.prefetch_wasted - before.prefetch_wasted,
    };
    (pass, secs)
}

const PAGES: usize = 16_384;
const BUDGET_PAGES: usize = PAGES / 4;

#[test]
fn a_sequential_scan_is_read_ahead() {
    let region = region(PAGES, BUDGET_PAGES, true, ram_store(PAGES));
    let (pass, secs) = read_pass(&region, 0..PAGES);
    eprintln!("sequential, prefetch: {secs:.3} s, {pass:?}");
    let faults = pass.faults_from_store;
    assert!(faults < PAGES as u64 / 20, "{faults} store faults: {pass:?}");
    assert!(pass.pages_prefetched + faults >= PAGES as u64 - BUDGET_PAGES as u64, "{pass:?}");
    assert!(pass.prefetch_hits * 10 >= pass.pages_prefetched * 9, "{pass:?}");
    assert!(pass.pages_resident <= BUDGET_PAGES as u64, "{pass:?}");
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
        assert!(pass.faults_from_store < touched / 10, "{pass:?}");
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
    assert!(pass.faults_from_store > PAGES as u64 / 2, "{pass:?}");
    assert!(pass.pages_prefetched * 100 <= pass.faults_from_store, "{pass:?}");
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
    let (stats, handler) = (region.stats(), region.handler_stats());
    eprintln!("{stats:?} {handler:?}");
    assert!(handler.pages_prefetched > 0, "{handler:?}");
    assert!(stats.pages_resident <= BUDGET_PAGES as u64, "{stats:?}");
}

/// Sum every word of every page, in order: a scan that does some work per
/// page. Seconds.
fn sum_pass(region: &Region) -> f64 {
    write_pages(region, 0..PAGES, 1);
    let start = Instant::now();
    let mut sum = 0u64;
    for page in 0..PAGES {
        for w in 0..PAGE_SIZE / 8 {
            // SAFETY: an aligned word inside the live region; one thread.
            sum = sum.wrapping_add(unsafe { word(region, page).add(w).read_volatile() });
        }
    }
    std::hint::black_box(sum);
    start.elapsed().as_secs_f64()
}

fn scan(name: &str, store: Arc<dyn PageStore>, prefetch: bool) {
    let reader = region(PAGES, BUDGET_PAGES, prefetch, store.clone());
    let (pass, secs) = read_pass(&reader, 0..PAGES);
    drop(reader);
    let summing = region(PAGES, BUDGET_PAGES, prefetch, store);
    let sum_secs = sum_pass(&summing);
    let faults = pass.faults_from_store + pass.faults_zero_filled;
    eprintln!(
        "{name:5} prefetch {prefetch:5}: {secs:.3} s, {:>7.0} pages/s, {:>6} faults ({:>7.0}/s), \
         {} prefetched, {} hits, {} wasted; summing every word: {:>7.0} pages/s",
        PAGES as f64 / secs,
        faults,
        faults as f64 / secs,
        pass.pages_prefetched,
        pass.prefetch_hits,
        pass.prefetch_wasted,
        PAGES as f64 / sum_secs,
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
