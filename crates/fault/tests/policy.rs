//! Replacement on a real region: the same zipf(0.99) trace, FIFO against
//! S3-FIFO, counted in store faults.

use memlend_fault::{Policy, Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;
use std::time::Instant;

const PAGES: usize = 8192;
const BUDGET_PAGES: usize = PAGES / 4;

/// Pages of a zipf(0.99) trace by inverse CDF over a xorshift stream, hot
/// ranks scattered over the region; every fourth access a write.
fn zipf_trace(len: usize) -> Vec<(usize, bool)> {
    let mut cdf: Vec<f64> = (1..=PAGES).map(|k| 1.0 / (k as f64).powf(0.99)).collect();
    let mut sum = 0.0;
    cdf.iter_mut().for_each(|c| {
        sum += *c;
        *c = sum;
    });
    let mut x = 0x1234_5678_9abc_def1u64;
    (0..len)
        .map(|i| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let u = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
            let rank = cdf.partition_point(|&c| c < u * sum).min(PAGES - 1);
            ((rank * 0x9E37_79B9) % PAGES, i % 4 == 0)
        })
        .collect()
}

/// Store faults for the trace after every page was written once.
fn store_faults(policy: Policy, trace: &[(usize, bool)]) -> (u64, f64) {
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: BUDGET_PAGES,
        evict_batch_pages: 32,
    };
    let region =
        Region::with_tuning(config, Tuning { policy, ..Tuning::default() }, store).unwrap();
    let base = region.as_ptr() as usize;
    let word = |page: usize| (base + page * PAGE_SIZE) as *mut u64;
    for page in 0..PAGES {
        // SAFETY: an aligned word inside the live region; one thread.
        unsafe { word(page).write_volatile(page as u64 + 1) };
    }
    let before = region.stats().faults_from_store;
    let start = Instant::now();
    for &(page, write) in trace {
        // SAFETY: as above.
        unsafe {
            let got = word(page).read_volatile();
            assert_eq!(got & 0xFFFF_FFFF, page as u64 + 1, "page {page}");
            if write {
                word(page).write_volatile(got + (1 << 32));
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = region.stats();
    assert!(stats.pages_resident <= BUDGET_PAGES as u64, "{stats:?}");
    eprintln!("{policy:?}: {stats:?} {:?}", region.handler_stats());
    (stats.faults_from_store - before, secs)
}

#[test]
fn s3fifo_takes_fewer_store_faults_than_fifo_on_zipf() {
    let trace = zipf_trace(150_000);
    let (fifo, fifo_s) = store_faults(Policy::Fifo, &trace);
    let (s3, s3_s) = store_faults(Policy::S3Fifo, &trace);
    eprintln!(
        "zipf 0.99, {} accesses, {PAGES} pages, budget {BUDGET_PAGES}: store faults FIFO {fifo} \
         ({fifo_s:.2} s), S3-FIFO {s3} ({s3_s:.2} s)",
        trace.len()
    );
    assert!(s3 < fifo, "S3-FIFO {s3} vs FIFO {fifo}");
}
