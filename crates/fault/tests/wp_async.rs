//! WP_ASYNC + PAGEMAP_SCAN against synchronous WP faults, measured in one
//! run (`--ignored --nocapture`). The region uses synchronous WP faults; this
//! test builds the asynchronous alternative by hand on a plain mapping: the
//! kernel resolves the first write to a write-protected page itself (no
//! message), and PAGEMAP_SCAN with PM_SCAN_WP_MATCHING reports the written
//! pages and protects them again in one call.

use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

const PAGES: usize = 16_384;

const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_WP_ASYNC: u64 = 1 << 15;
const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const REGISTER_MODE_WP: u64 = 1 << 1;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const fn iowr(ty: u64, nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (ty << 8) | nr
}
const UFFDIO_API: u64 = iowr(0xAA, 0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0xAA, 0x00, 32);
const UFFDIO_WRITEPROTECT: u64 = iowr(0xAA, 0x06, 24);
const PAGEMAP_SCAN: u64 = iowr(b'f' as u64, 16, size_of::<PmScanArg>());
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    pages_max: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

fn ioctl<T>(fd: i32, request: u64, arg: &mut T) -> i64 {
    // SAFETY: each request is paired with the struct of its size and layout.
    unsafe { libc::ioctl(fd, request as _, arg as *mut T) as i64 }
}

fn check(rc: i64, what: &str) {
    assert!(rc >= 0, "{what}: {}", std::io::Error::last_os_error());
}

/// A populated anonymous mapping, registered WP-only with an async-WP uffd
/// and write-protected. Returns (address, uffd).
fn async_wp_mapping() -> (usize, i32) {
    let len = PAGES * PAGE_SIZE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
    // SAFETY: a fresh anonymous mapping; leaked at the end of the test.
    let addr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
    };
    assert_ne!(addr, libc::MAP_FAILED);
    // SAFETY: populated, writable, ours.
    unsafe { std::ptr::write_bytes(addr.cast::<u8>(), 1, len) };
    // SAFETY: userfaultfd(2) takes flags and returns a new descriptor.
    let uffd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    check(uffd, "userfaultfd");
    let uffd = uffd as i32;
    let features = FEATURE_PAGEFAULT_FLAG_WP | FEATURE_WP_ASYNC | FEATURE_WP_UNPOPULATED;
    let mut api = [0xAAu64, features, 0];
    check(ioctl(uffd, UFFDIO_API, &mut api), "UFFDIO_API with WP_ASYNC");
    let mut reg = [addr as u64, len as u64, REGISTER_MODE_WP, 0];
    check(ioctl(uffd, UFFDIO_REGISTER, &mut reg), "UFFDIO_REGISTER");
    (addr as usize, uffd)
}

fn protect(uffd: i32, addr: usize) -> f64 {
    let start = Instant::now();
    let mut wp = [addr as u64, (PAGES * PAGE_SIZE) as u64, WRITEPROTECT_MODE_WP];
    check(ioctl(uffd, UFFDIO_WRITEPROTECT, &mut wp), "UFFDIO_WRITEPROTECT");
    start.elapsed().as_secs_f64()
}

/// PAGEMAP_SCAN of the mapping for written pages, protecting them again.
/// Returns (pages written, seconds).
fn scan_written(pagemap: i32, addr: usize, regions: &mut [PageRegion]) -> (usize, f64) {
    let mut arg = PmScanArg {
        size: size_of::<PmScanArg>() as u64,
        flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
        start: addr as u64,
        end: (addr + PAGES * PAGE_SIZE) as u64,
        vec: regions.as_mut_ptr() as u64,
        vec_len: regions.len() as u64,
        category_mask: PAGE_IS_WRITTEN,
        return_mask: PAGE_IS_WRITTEN,
        ..PmScanArg::default()
    };
    let start = Instant::now();
    let n = ioctl(pagemap, PAGEMAP_SCAN, &mut arg);
    let secs = start.elapsed().as_secs_f64();
    check(n, "PAGEMAP_SCAN");
    let pages = regions[..n as usize].iter().map(|r| (r.end - r.start) as usize / PAGE_SIZE).sum();
    (pages, secs)
}

/// Write one word to every `every`-th page; seconds.
fn write_every(addr: usize, every: usize) -> f64 {
    let start = Instant::now();
    for page in (0..PAGES).step_by(every) {
        // SAFETY: an aligned word inside our populated mapping.
        unsafe { ((addr + page * PAGE_SIZE) as *mut u64).write_volatile(page as u64) };
    }
    start.elapsed().as_secs_f64()
}

/// First writes to `PAGES` clean resident pages of a region: one synchronous
/// WP fault each, through the handler thread.
fn sync_wp_writes() -> f64 {
    let store = Arc::new(RamStore::new(2 * PAGES as u64, RamOptions::default()).unwrap());
    let config = RegionConfig {
        size_bytes: 2 * PAGES * PAGE_SIZE,
        budget_pages: PAGES,
        evict_batch_pages: 32,
    };
    let tuning = Tuning { prefetch_pages_max: 0, low_water_pages: Some(0), ..Tuning::default() };
    let region = Region::with_tuning(config, tuning, store).unwrap();
    let word = |page: usize| (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64;
    // Write all, then read all back: the last PAGES pages are clean.
    for pass in 0..2 {
        for page in 0..2 * PAGES {
            // SAFETY: an aligned word inside the live region; one thread.
            unsafe {
                if pass == 0 {
                    word(page).write_volatile(page as u64 + 1);
                } else {
                    std::hint::black_box(word(page).read_volatile());
                }
            }
        }
    }
    let before = region.stats().faults_write_protect;
    let start = Instant::now();
    for page in PAGES..2 * PAGES {
        // SAFETY: as above.
        unsafe { word(page).write_volatile(7) };
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(region.stats().faults_write_protect - before, PAGES as u64);
    secs
}

#[test]
#[ignore = "measurement"]
fn measure_wp_async_against_sync_wp_faults() {
    let (addr, uffd) = async_wp_mapping();
    let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut regions = vec![PageRegion::default(); PAGES];
    let protect_s = protect(uffd, addr);
    let (clean, _) = scan_written(pagemap.as_raw_fd(), addr, &mut regions);
    assert_eq!(clean, 0, "freshly protected pages read as not written");
    for every in [1, 16] {
        let write_s = write_every(addr, every);
        let (written, scan_s) = scan_written(pagemap.as_raw_fd(), addr, &mut regions);
        assert_eq!(written, PAGES.div_ceil(every));
        let (again, _) = scan_written(pagemap.as_raw_fd(), addr, &mut regions);
        assert_eq!(again, 0, "the scan protected them again");
        eprintln!(
            "WP_ASYNC: {written} first writes in {:.2} us each; PAGEMAP_SCAN + re-protect of \
             {PAGES} pages ({written} written): {:.0} us",
            write_s * 1e6 / written as f64,
            scan_s * 1e6,
        );
    }
    let sync_s = sync_wp_writes();
    eprintln!(
        "protect {PAGES} pages: {:.0} us; synchronous WP fault via the handler: {:.2} us each",
        protect_s * 1e6,
        sync_s * 1e6 / PAGES as f64
    );
}
