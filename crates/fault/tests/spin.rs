//! The handler spinning on the uffd before sleeping: fault latency with
//! and without. Run `measure_spin` with `--ignored --nocapture`.

use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGES: usize = 16_384;
const BUDGET_PAGES: usize = PAGES / 4;

fn region(spin_us: u32) -> Region {
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: BUDGET_PAGES,
        evict_batch_pages: 32,
    };
    let tuning = Tuning { prefetch_pages_max: 0, spin_us, ..Tuning::default() };
    Region::with_tuning(config, tuning, store).unwrap()
}

fn word(region: &Region, page: usize) -> *mut u64 {
    assert!(page * PAGE_SIZE < region.len());
    (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64
}

/// Latency (ns) of each read of `order`, with `think` of busy work after each.
fn timed_reads(region: &Region, order: &[usize], think: Duration) -> Vec<u64> {
    let mut latencies = Vec::with_capacity(order.len());
    for &page in order {
        let start = Instant::now();
        // SAFETY: an aligned word inside the live region; one thread.
        std::hint::black_box(unsafe { word(region, page).read_volatile() });
        latencies.push(start.elapsed().as_nanos() as u64);
        let until = Instant::now() + think;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    latencies.sort_unstable();
    latencies
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1000.0
}

#[test]
fn spinning_serves_faults() {
    let region = region(50);
    for page in 0..PAGES {
        // SAFETY: as in `timed_reads`.
        unsafe { word(&region, page).write_volatile(page as u64) };
    }
    let order: Vec<usize> = (0..PAGES).collect();
    timed_reads(&region, &order, Duration::ZERO);
    let stats = region.stats();
    assert!(stats.faults_from_store > 0 && stats.pages_resident <= BUDGET_PAGES as u64);
}

#[test]
#[ignore = "measurement"]
fn measure_spin() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let random: Vec<usize> = (0..20_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % PAGES as u64) as usize
        })
        .collect();
    for think_us in [0, 20, 100] {
        for spin_us in [0, 20, 50] {
            let region = region(spin_us);
            let think = Duration::from_micros(think_us);
            let zero = timed_reads(&region, &(0..PAGES).collect::<Vec<_>>(), think);
            for page in 0..PAGES {
                // SAFETY: as in `timed_reads`.
                unsafe { word(&region, page).write_volatile(page as u64) };
            }
            let store = timed_reads(&region, &random, think);
            let faulted: Vec<u64> = store.iter().copied().filter(|&ns| ns > 2000).collect();
            eprintln!(
                "think {think_us:>2} us, spin {spin_us:>2} us: zero-fill p50 {:.1} p99 {:.1} us; \
                 store fault p50 {:.1} p99 {:.1} us ({} faults)",
                pct(&zero, 0.5),
                pct(&zero, 0.99),
                pct(&faulted, 0.5),
                pct(&faulted, 0.99),
                faulted.len(),
            );
        }
    }
}
