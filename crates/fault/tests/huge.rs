//! Huge pages on a real region (`huge.rs`): a region whose pages all fit
//! its budget gets its full 2 MiB chunks collapsed into huge pages, which
//! the kernel then reports as AnonHugePages; every byte reads back, also
//! after the budget falls and eviction splits them. A region that does not
//! fit never collapses anything.

use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 16 MiB: at least seven whole aligned chunks wherever it lands. Regions
/// are twice this.
const PAGES: usize = 4096;

fn region(budget_pages: usize) -> Region {
    let store = Arc::new(RamStore::new(2 * PAGES as u64, RamOptions::default()).unwrap());
    let config =
        RegionConfig { size_bytes: 2 * PAGES * PAGE_SIZE, budget_pages, evict_batch_pages: 32 };
    Region::with_tuning(config, Tuning::default(), store).unwrap()
}

fn value(page: usize, slot: usize, version: u64) -> u64 {
    ((page * 512 + slot) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version
}

fn word(region: &Region, page: usize, slot: usize) -> *mut u64 {
    assert!(page < 2 * PAGES && slot < PAGE_SIZE / 8);
    (region.as_ptr() as usize + page * PAGE_SIZE + slot * 8) as *mut u64
}

/// Three words of every page: its first, a middle one and its last.
const SLOTS: [usize; 3] = [0, 200, PAGE_SIZE / 8 - 1];

/// Pages `first..first + PAGES`.
fn write_all(region: &Region, first: usize, version: u64) {
    for page in first..first + PAGES {
        for slot in SLOTS {
            // SAFETY: inside the live region; the handler maps the page.
            unsafe { word(region, page, slot).write_volatile(value(page, slot, version)) };
        }
    }
}

fn check_all(region: &Region, first: usize, version: u64) {
    for page in first..first + PAGES {
        for slot in SLOTS {
            // SAFETY: as in `write_all`.
            let got = unsafe { word(region, page, slot).read_volatile() };
            assert_eq!(got, value(page, slot, version), "page {page} slot {slot}");
        }
    }
}

/// KiB of the region mapped by huge pages, from /proc/self/smaps.
fn huge_kib(region: &Region) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (start, end) = (region.as_ptr() as u64, region.as_ptr() as u64 + region.len() as u64);
    let mut inside = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
        let parsed = range.and_then(|(a, b)| {
            Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?))
        });
        if let Some((a, b)) = parsed.filter(|_| line.contains(' ') && !line.ends_with(" kB")) {
            inside = a >= start && b <= end;
        } else if let Some(rest) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
            kib += rest.trim().trim_end_matches(" kB").trim().parse::<u64>().unwrap();
        }
    }
    kib
}

fn thp_off() -> Option<String> {
    let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    setting
        .contains("[never]")
        .then(|| format!("transparent huge pages are off ({})", setting.trim()))
}

#[test]
fn a_region_that_fits_gets_huge_pages_and_keeps_its_bytes_when_they_split() {
    if let Some(why) = thp_off() {
        return memlend_testskip::skip(&why);
    }
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let region = region(3 * PAGES);
    write_all(&region, 0, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while region.handler_stats().huge_collapsed < 7 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = region.handler_stats();
    assert!(
        stats.huge_collapsed >= 7,
        "collapsed {} chunks, failed {}",
        stats.huge_collapsed,
        stats.huge_failed
    );
    assert!(huge_kib(&region) >= 7 * 2048, "AnonHugePages {} KiB", huge_kib(&region));
    check_all(&region, 0, 1);
    write_all(&region, 0, 2);

    // Now the budget falls to a sixteenth and the program writes as much
    // again beside: eviction moves pages out of the huge pages (splitting
    // them), and every byte still reads back.
    region.set_budget_pages(PAGES / 16);
    write_all(&region, PAGES, 2);
    check_all(&region, 0, 2);
    check_all(&region, PAGES, 2);
    // The budget stops at twice the handler's buffers (a few thousand
    // pages here), so a few huge pages may survive; most were split.
    let written_back = region.stats().pages_written_back as usize;
    assert!(written_back >= PAGES / 2, "{written_back} pages written back");
    assert!(huge_kib(&region) <= 4 * 2048, "AnonHugePages {} KiB", huge_kib(&region));
}

#[test]
fn a_region_that_does_not_fit_never_collapses() {
    let region = region(PAGES / 4);
    let until = Instant::now() + Duration::from_millis(2500);
    let mut version = 0;
    while Instant::now() < until {
        version += 1;
        write_all(&region, 0, version);
    }
    check_all(&region, 0, version);
    let stats = region.handler_stats();
    assert_eq!((stats.huge_collapsed, stats.huge_failed), (0, 0));
    assert_eq!(huge_kib(&region), 0);
}
