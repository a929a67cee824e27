//! The compressed local tier over real userfaultfd and real bytes: pages
//! that compress come back from the pool byte for byte, the pool and the
//! mapped pages together stay within the budget, pages that do not
//! compress never enter it, and discarded pages do not come back.

use memlend_fault::{Codec, Region, RegionConfig, Tuning};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;

const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;
const PAGES: usize = 4096;
const BUDGET_PAGES: usize = 1024;

/// A region over a RAM store; with `compress`, a pool that admits every
/// victim (`admits_all`, the pool's mechanics) or reused ones only.
fn region(compress: bool, admits_all: bool) -> Region {
    region_with(compress, admits_all, Codec::Lz4)
}

fn region_with(compress: bool, admits_all: bool, codec: Codec) -> Region {
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config = RegionConfig {
        size_bytes: PAGES * PAGE_SIZE,
        budget_pages: BUDGET_PAGES,
        evict_batch_pages: 32,
    };
    let tuning = Tuning {
        compress,
        pool_admits_all: admits_all,
        pool_codec: codec,
        prefetch_pages_max: 0,
        ..Tuning::default()
    };
    Region::with_tuning(config, tuning, store).unwrap()
}

fn words(region: &mut Region) -> &mut [u64] {
    // SAFETY: the region is a live, writable, page-aligned mapping of
    // `len()` bytes for as long as `region` is borrowed, and the exclusive
    // borrow keeps this the only view.
    unsafe { std::slice::from_raw_parts_mut(region.as_ptr().cast(), region.len() / 8) }
}

/// Runs of eight equal words, unique to (page, seed): compresses about 8x.
fn compressible(page: usize, word: usize, seed: u64) -> u64 {
    ((page as u64) << 32) ^ ((word / 8) as u64) << 8 ^ seed
}

/// A multiplicative hash: lz4 finds nothing to take out.
fn incompressible(page: usize, word: usize, seed: u64) -> u64 {
    let x = ((page * WORDS_PER_PAGE + word) as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Skewed: a quarter of the pages take most touches.
    fn page(&mut self) -> usize {
        let r = self.next();
        if r.is_multiple_of(4) {
            (r >> 8) as usize % PAGES
        } else {
            (r >> 8) as usize % (PAGES / 4)
        }
    }
}

fn fill(region: &mut Region, f: fn(usize, usize, u64) -> u64, seed: u64) {
    for (page, chunk) in words(region).chunks_mut(WORDS_PER_PAGE).enumerate() {
        for (word, w) in chunk.iter_mut().enumerate() {
            *w = f(page, word, seed);
        }
    }
}

/// Every word of every page, against `seeds[page]`.
fn verify(region: &mut Region, f: fn(usize, usize, u64) -> u64, seeds: &[u64]) {
    for (page, chunk) in words(region).chunks(WORDS_PER_PAGE).enumerate() {
        for (word, &w) in chunk.iter().enumerate() {
            assert_eq!(w, f(page, word, seeds[page]), "page {page} word {word}");
        }
    }
}

fn within_budget(region: &Region) {
    let resident = region.stats().pages_resident as usize;
    let pool = region.handler_stats().pool_charged_pages as usize;
    assert!(resident + pool <= BUDGET_PAGES, "{resident} mapped + {pool} pool > {BUDGET_PAGES}");
}

#[test]
fn compressible_pages_come_back_from_the_pool_byte_for_byte() {
    pages_come_back_through(Codec::Lz4);
}

#[test]
fn compressible_pages_come_back_from_a_zstd_pool_byte_for_byte() {
    pages_come_back_through(Codec::Zstd);
}

fn pages_come_back_through(codec: Codec) {
    let mut region = region_with(true, true, codec);
    let mut seeds = vec![1u64; PAGES];
    fill(&mut region, compressible, 1);
    let mut rng = Rng(0x5EED);
    for round in 0..20_000u32 {
        let page = rng.page();
        let word = (rng.next() as usize) % WORDS_PER_PAGE;
        let w = &mut words(&mut region)[page * WORDS_PER_PAGE..(page + 1) * WORDS_PER_PAGE];
        assert_eq!(w[word], compressible(page, word, seeds[page]), "round {round} page {page}");
        if round.is_multiple_of(5) {
            // A write: the page is written back and kept anew.
            seeds[page] += 1;
            for (i, x) in w.iter_mut().enumerate() {
                *x = compressible(page, i, seeds[page]);
            }
        }
        if round.is_multiple_of(1000) {
            within_budget(&region);
        }
    }
    within_budget(&region);
    verify(&mut region, compressible, &seeds);
    let (basic, h) = (region.stats(), region.handler_stats());
    eprintln!("{basic:?}\n{h:?}");
    assert!(h.faults_from_pool > 1000, "the pool served faults: {h:?}");
    assert!(h.pool_pages_stored > 0 && h.pool_pages_incompressible == 0, "{h:?}");
    assert!(
        h.fault_pool_latency_ns_p50 > 0
            && h.fault_pool_latency_ns_p99 >= h.fault_pool_latency_ns_p50
    );
}

/// By default the pool admits only victims that came back after an
/// eviction: one pass of writes compresses nothing; pages read again and
/// again then fill it, and come back from it byte for byte.
#[test]
fn by_default_only_pages_that_come_back_enter_the_pool() {
    let mut region = region(true, false);
    fill(&mut region, compressible, 1);
    let h = region.handler_stats();
    assert_eq!((h.pool_pages_stored, h.pool_pages_incompressible), (0, 0), "one pass: {h:?}");
    let mut rng = Rng(0x5EED);
    for _ in 0..20_000u32 {
        let page = rng.page();
        let word = (rng.next() as usize) % WORDS_PER_PAGE;
        assert_eq!(words(&mut region)[page * WORDS_PER_PAGE + word], compressible(page, word, 1));
    }
    within_budget(&region);
    verify(&mut region, compressible, &vec![1; PAGES]);
    let h = region.handler_stats();
    assert!(h.pool_pages_stored > 0 && h.faults_from_pool > 1000, "reused pages: {h:?}");
}

#[test]
fn incompressible_pages_never_enter_the_pool() {
    let mut region = region(true, true);
    fill(&mut region, incompressible, 7);
    verify(&mut region, incompressible, &vec![7; PAGES]);
    let h = region.handler_stats();
    assert_eq!((h.faults_from_pool, h.pool_pages_held, h.pool_charged_pages), (0, 0, 0), "{h:?}");
    assert!(h.pool_pages_incompressible > 0, "victims were tried: {h:?}");
    assert!(region.stats().faults_from_store > 0);
    assert!(h.fault_store_latency_ns_p50 > 0, "misses are timed: {h:?}");
}

#[test]
fn discarded_pages_read_zero_not_their_pooled_bytes() {
    let mut region = region(true, true);
    fill(&mut region, compressible, 3);
    // The pool holds the latest victims, which lie in the middle pages.
    let held = region.handler_stats().pool_pages_held;
    assert!(held > 0);
    let (first, count) = (PAGES / 4, PAGES / 2);
    region.discard(first * PAGE_SIZE, count * PAGE_SIZE).unwrap();
    let after = region.handler_stats().pool_pages_held;
    assert!(after < held, "the discarded pages' copies stay in the pool: {after} of {held}");
    let w = words(&mut region);
    let range = first * WORDS_PER_PAGE..(first + count) * WORDS_PER_PAGE;
    assert!(w[range].iter().all(|&x| x == 0), "a discarded page read old bytes");
    let mut seeds = vec![3u64; PAGES];
    for (page, chunk) in w.chunks_mut(WORDS_PER_PAGE).enumerate().skip(first).take(count) {
        seeds[page] = 4;
        for (word, x) in chunk.iter_mut().enumerate() {
            *x = compressible(page, word, 4);
        }
    }
    verify(&mut region, compressible, &seeds);
}

#[test]
fn a_region_that_fits_its_budget_keeps_no_pool() {
    let mut region = region(true, true);
    fill(&mut region, compressible, 5);
    assert!(region.handler_stats().pool_pages_held > 0);
    // Free three quarters: what is left fits, and the pool gives its room back.
    region.discard(0, 3 * PAGES / 4 * PAGE_SIZE).unwrap();
    let mut seeds = vec![0u64; PAGES];
    seeds[3 * PAGES / 4..].fill(5);
    for page in 0..3 * PAGES / 4 {
        for word in 0..WORDS_PER_PAGE {
            assert_eq!(words(&mut region)[page * WORDS_PER_PAGE + word], 0);
        }
    }
    // Zero pages are dropped, not kept; the live quarter is touched again.
    let f: fn(usize, usize, u64) -> u64 = |p, w, s| if s == 0 { 0 } else { compressible(p, w, s) };
    verify(&mut region, f, &seeds);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let h = region.handler_stats();
    assert_eq!((h.pool_pages_held, h.pool_charged_pages), (0, 0), "{h:?}");
}

/// Three threads, each on its own pages, read and bump counters at random
/// while their pages churn between the mapped set, the pool and the store
/// (a quarter of the region fits). Every count must survive: a stale pool
/// copy (a page compressed, then written, then served from the old copy)
/// would lose increments. Every third bump also fills the rest of the page
/// with noise and the next one clears it, so that a page's newer bytes
/// often do not compress and leave no newer copy to replace an old one.
#[test]
fn counters_churning_through_the_pool_lose_no_increment() {
    const THREADS: usize = 3;
    const ROUNDS: usize = 30_000;
    let region = region(true, true);
    let base = region.as_ptr() as usize;
    let counts: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                scope.spawn(move || {
                    let mut counts = vec![0u64; PAGES];
                    let mut rng = Rng(0x1234 + t as u64);
                    for _ in 0..ROUNDS {
                        let page = rng.page() / THREADS * THREADS + t;
                        if page >= PAGES {
                            continue;
                        }
                        let word = (page * 7 + t) % WORDS_PER_PAGE;
                        let ptr = (base + page * PAGE_SIZE + word * 8) as *mut u64;
                        // SAFETY: an aligned word inside the live region, on
                        // a page only thread `t` touches.
                        let now = unsafe { ptr.read_volatile() };
                        assert_eq!(now, counts[page], "thread {t} page {page}");
                        // SAFETY: as above.
                        unsafe { ptr.write_volatile(now + 1) };
                        counts[page] += 1;
                        let page_words = (base + page * PAGE_SIZE) as *mut u64;
                        for other in (0..WORDS_PER_PAGE).filter(|&w| w != word) {
                            let noise = match counts[page] % 3 {
                                0 => incompressible(page, other, counts[page]),
                                _ => 0,
                            };
                            // SAFETY: as above, another word of the same page.
                            unsafe { page_words.add(other).write_volatile(noise) };
                        }
                    }
                    counts
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut region = region;
    let w = words(&mut region);
    for (t, counts) in counts.iter().enumerate() {
        for page in (t..PAGES).step_by(THREADS) {
            let word = (page * 7 + t) % WORDS_PER_PAGE;
            assert_eq!(w[page * WORDS_PER_PAGE + word], counts[page], "thread {t} page {page}");
        }
    }
    let h = region.handler_stats();
    assert!(h.faults_from_pool > 1000, "the pages went through the pool: {h:?}");
    within_budget(&region);
}

/// A budget lowered while the region is in use (as `memlend run --mem`
/// does when the rest of the process grows): the mapped pages and the pool
/// come down to it, and every byte stays.
#[test]
fn a_lowered_budget_is_followed_by_mapped_pages_and_pool() {
    let mut region = region(true, true);
    fill(&mut region, compressible, 9);
    let lower = BUDGET_PAGES / 2;
    region.set_budget_pages(lower);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let fits = |region: &Region| {
        let h = region.handler_stats();
        region.stats().pages_resident + h.pool_charged_pages <= lower as u64
    };
    while !fits(&region) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (basic, h) = (region.stats(), region.handler_stats());
    assert!(fits(&region), "not within {lower} after 5 s: {basic:?} {h:?}");
    assert_eq!(h.budget_pages, lower as u64);
    verify(&mut region, compressible, &[9; PAGES]);
    let (basic, h) = (region.stats(), region.handler_stats());
    assert!(basic.pages_resident + h.pool_charged_pages <= lower as u64, "{basic:?} {h:?}");
}
