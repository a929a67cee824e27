//! Eviction ahead of need: when no fault is pending and the region is
//! within the low-water margin of its budget, the handler evicts a batch,
//! so a fault usually finds room. `measure_eviction_ahead` (ignored) prints
//! fault latency with and without it.

use memlend_fault::{HandlerStats, Region, RegionConfig, RegionStats, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGES: usize = 16_384;
const BUDGET_PAGES: usize = PAGES / 4;

fn region(low_water_pages: usize) -> Region {
    region_with_budget(low_water_pages, BUDGET_PAGES)
}

fn region_with_budget(low_water_pages: usize, budget_pages: usize) -> Region {
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config =
        RegionConfig { size_bytes: PAGES * PAGE_SIZE, budget_pages, evict_batch_pages: 32 };
    let tuning = Tuning {
        prefetch_pages_max: 0,
        low_water_pages: Some(low_water_pages),
        ..Tuning::default()
    };
    Region::with_tuning(config, tuning, store).unwrap()
}

fn word(region: &Region, page: usize) -> *mut u64 {
    assert!(page * PAGE_SIZE < region.len());
    (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64
}

fn random_pages(count: usize) -> Vec<usize> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % PAGES as u64) as usize
        })
        .collect()
}

/// Write every page, then read `order` with `think` of busy work after each
/// access; the latency of each access (ns), and the stats.
fn run(
    region: &Region,
    order: &[usize],
    think: Duration,
) -> (Vec<u64>, (RegionStats, HandlerStats), f64) {
    for page in 0..PAGES {
        // SAFETY: an aligned word inside the live region; one thread.
        unsafe { word(region, page).write_volatile(page as u64 + 1) };
    }
    let mut latencies = Vec::with_capacity(order.len());
    let start = Instant::now();
    for &page in order {
        let start = Instant::now();
        // SAFETY: as above.
        let got = unsafe { word(region, page).read_volatile() };
        latencies.push(start.elapsed().as_nanos() as u64);
        assert_eq!(got, page as u64 + 1, "page {page}");
        let until = Instant::now() + think;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    let stats = (region.stats(), region.handler_stats());
    (latencies, stats, start.elapsed().as_secs_f64())
}

#[test]
fn idle_time_is_used_to_evict_ahead() {
    let region = region(64);
    let (_, (stats, handler), _) = run(&region, &random_pages(4000), Duration::from_micros(50));
    eprintln!("{stats:?} {handler:?}");
    assert!(handler.eviction_batches_ahead > 0, "{handler:?}");
    assert!(stats.pages_resident <= BUDGET_PAGES as u64, "{stats:?}");
    // A fault found the margin empty only if it came during a batch.
    let free = BUDGET_PAGES as u64 - stats.pages_resident;
    assert!(free >= 32, "{free} pages free when idle: {stats:?}");
}

/// A program whose pages all fit its budget keeps them all mapped, however
/// close to the budget it runs: before, the low-water margin evicted ahead
/// anyway, and a sequential pass over exactly a budget's worth of pages
/// missed on every page.
#[test]
fn pages_that_fit_the_budget_are_never_evicted_ahead() {
    let fits = BUDGET_PAGES - 8;
    let region = region_with_budget(256, BUDGET_PAGES);
    for pass in 0..3u64 {
        for page in 0..fits {
            // SAFETY: an aligned word inside the live region; one thread.
            let got = unsafe { word(&region, page).read_volatile() };
            assert_eq!(got, if pass == 0 { 0 } else { pass * 1000 + page as u64 });
            // SAFETY: as above.
            unsafe { word(&region, page).write_volatile((pass + 1) * 1000 + page as u64) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (stats, handler) = (region.stats(), region.handler_stats());
    assert_eq!(stats.faults_from_store, 0, "{stats:?} {handler:?}");
    assert_eq!(stats.eviction_batches, 0, "{stats:?} {handler:?}");
    // Zero-fill ahead may map a few pages past the scan, never past the budget.
    assert!((fits..=BUDGET_PAGES).contains(&(stats.pages_resident as usize)), "{stats:?}");
    // A dozen scattered pages more than fit: now the handler's buffers
    // are kept out of the budget, and the margin kept free below that is
    // about the dozen (plus one eviction batch), not the 256 asked for.
    for i in 0..12 {
        // SAFETY: as above.
        unsafe { word(&region, PAGES - 1 - i * i * 7).write_volatile(7) };
    }
    std::thread::sleep(Duration::from_millis(50));
    let stats = region.stats();
    let reserved = region.reserved_pages();
    assert!((1..=BUDGET_PAGES / 4).contains(&reserved), "{reserved} reserved");
    let margin = BUDGET_PAGES - reserved - stats.pages_resident as usize;
    assert!((1..=64).contains(&margin), "{margin} pages free: {stats:?}");
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1000.0
}

#[test]
#[ignore = "measurement"]
fn measure_eviction_ahead() {
    let order = random_pages(20_000);
    for think_us in [0, 20, 100] {
        for low_water in [0, 64] {
            let region = region(low_water);
            let (mut lat, (stats, handler), secs) =
                run(&region, &order, Duration::from_micros(think_us));
            lat.sort_unstable();
            let faults = stats.faults_from_store;
            let faulted: Vec<u64> = lat.iter().copied().filter(|&ns| ns > 2000).collect();
            eprintln!(
                "think {think_us:>3} us, low water {low_water:>2}: read pass {secs:.3} s, {faults} \
                 store faults; access p50 {:.1} us; faulting accesses p50 {:.1} p99 {:.1} max {:.1} \
                 us; {} batches ahead of {}",
                percentile(&lat, 0.5),
                percentile(&faulted, 0.5),
                percentile(&faulted, 0.99),
                percentile(&faulted, 1.0),
                handler.eviction_batches_ahead,
                stats.eviction_batches,
            );
        }
    }
}
