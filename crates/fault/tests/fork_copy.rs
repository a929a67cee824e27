//! `ParentCopy`: a forked child's page is copied from the parent's memory
//! only while that memory is mapped, write-protected and unchanged since
//! the fork's pause; anything else leaves it to the snapshot.

use memlend_fault::{ParentCopy, Region, RegionConfig};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;

const PAGES: usize = 64;
// Well above eviction ahead's margin (two batches), which it keeps free.
const BUDGET_PAGES: usize = 48;

fn byte(base: usize, page: usize) -> *mut u8 {
    (base + page * PAGE_SIZE) as *mut u8
}

fn mapped(base: usize, page: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: one page of the live region, one byte out; reads no page.
    let r = unsafe { libc::mincore(byte(base, page).cast(), PAGE_SIZE, &mut v) };
    assert_eq!(r, 0);
    v & 1 != 0
}

#[test]
fn only_a_mapped_protected_page_unchanged_since_the_pause_is_copied() {
    if let Err(why) = memlend_fault::check_access() {
        memlend_testskip::skip(&format!("userfaultfd: {why}"));
        return;
    }
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: BUDGET_PAGES,
        evict_batch_pages: 8,
    };
    let region = Region::new(config, store).unwrap();
    let base = region.as_ptr() as usize;
    for page in 0..PAGES {
        // SAFETY: a page of the live region; this test is its one writer.
        unsafe { std::ptr::write_bytes(byte(base, page), page as u8 + 1, PAGE_SIZE) };
    }
    // Read pages 0..4 back: they were evicted, so they come back from the
    // store, mapped write-protected.
    for page in 0..4 {
        // SAFETY: as above, a read.
        assert_eq!(unsafe { byte(base, page).read_volatile() }, page as u8 + 1);
    }
    let number = region.pause().unwrap().number();
    let copy = region.parent_copy(number).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];

    let page = copied_page(&copy, base, &mut buf);
    let page = page.unwrap_or_else(|| panic!("no page copied; {}", census(base)));
    assert!(buf.iter().all(|&b| b == page as u8 + 1), "page {page}'s bytes");
    assert!(!copy.copy(page, &mut buf, || false).unwrap(), "the store's copy changed since");

    let written = protected_page(base).expect("a protected page");
    // SAFETY: as above: the write raises a WP fault, the handler unprotects.
    unsafe { byte(base, written as usize).write_volatile(0x77) };
    assert!(!copy.copy(written, &mut buf, || true).unwrap(), "written since the pause");

    let absent = (0..PAGES).find(|&p| !mapped(base, p)).expect("an evicted page");
    assert!(!copy.copy(absent as u32, &mut buf, || true).unwrap(), "not mapped");
    assert!(!mapped(base, absent), "and the look did not fault it in");

    drop(region.pause().unwrap());
    let page = protected_page(base).expect("a protected page");
    assert!(!copy.copy(page, &mut buf, || true).unwrap(), "a later pause may have protected it");
    let later = region.parent_copy(number + 1).unwrap();
    let later = copied_page(&later, base, &mut buf);
    assert!(later.is_some(), "the later fork's child copies no page; {}", census(base));
}

/// The kernel's pagemap entry of one page: mapped and uffd-protected.
fn protected(base: usize, page: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut entry = [0u8; 8];
    pagemap.read_exact_at(&mut entry, ((base / PAGE_SIZE + page) * 8) as u64).unwrap();
    let entry = u64::from_ne_bytes(entry);
    entry & 1 << 63 != 0 && entry & 1 << 57 != 0
}

fn protected_page(base: usize) -> Option<u32> {
    (0..PAGES).find(|&p| protected(base, p)).map(|p| p as u32)
}

/// A page copied, the first that is: eviction ahead may move any page out
/// between the look here and the copy, so a few are tried.
fn copied_page(copy: &ParentCopy, base: usize, buf: &mut [u8]) -> Option<u32> {
    (0..PAGES)
        .filter(|&p| protected(base, p))
        .find(|&p| copy.copy(p as u32, buf, || true).unwrap())
        .map(|p| p as u32)
}

/// How many pages are mapped, and how many of those protected.
fn census(base: usize) -> String {
    let mapped = (0..PAGES).filter(|&p| mapped(base, p)).count();
    let protected = (0..PAGES).filter(|&p| protected(base, p)).count();
    format!("{mapped} pages mapped, {protected} protected")
}
