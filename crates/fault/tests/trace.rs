//! A tracing region records every access outside its small window, in
//! order, and its pages keep their bytes.

use memlend_fault::{trace, Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;

const PAGES: usize = 4096;
/// Pages written last, to push the others out of the window.
const FLUSH: usize = 2 * trace::WINDOW_PAGES;
const DATA: usize = PAGES - FLUSH;

#[test]
fn a_tracing_region_records_each_touch_outside_its_window_in_order() {
    let path = std::env::temp_dir().join(format!("memlend-trace-test-{}", std::process::id()));
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: trace::WINDOW_PAGES,
        evict_batch_pages: 32,
    };
    let region = Region::with_tuning(config, Tuning::tracing(path.clone()), store).unwrap();
    let word = |page: usize| (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64;
    // Write every page once (each a write fault): the last `FLUSH` push the
    // data pages out of the window. Then read the data pages back in a
    // stride far wider than the window (each a read fault).
    for page in 0..PAGES {
        // SAFETY: inside the live region; its handler serves the fault.
        unsafe { word(page).write_volatile(page as u64 + 1) };
    }
    let reads: Vec<usize> = (0..DATA).map(|i| (i * 1031) % DATA).collect();
    for &page in &reads {
        // SAFETY: as above.
        let got = unsafe { word(page).read_volatile() };
        assert_eq!(got, page as u64 + 1, "page {page} lost its bytes");
    }
    drop(region);
    let recorded = trace::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let writes: Vec<(u32, bool)> = (0..PAGES as u32).map(|p| (p, true)).collect();
    let expected_reads: Vec<(u32, bool)> = reads.iter().map(|&p| (p as u32, false)).collect();
    assert_eq!(recorded.len(), PAGES + DATA, "one entry per fault");
    assert_eq!(recorded[..PAGES], writes[..]);
    assert_eq!(recorded[PAGES..], expected_reads[..]);
}
