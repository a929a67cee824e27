use super::*;

/// A page that compresses: a repeating pattern unique to (page, seed), with
/// a few varying bytes so that no two pages are equal.
fn compressible(page: u32, seed: u8) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 61) as u8 ^ seed).collect();
    bytes[..4].copy_from_slice(&page.to_le_bytes());
    bytes[PAGE_SIZE - 1] = seed;
    bytes
}

/// A page that does not: xorshift bytes.
fn random(page: u32) -> Vec<u8> {
    let mut x = u64::from(page).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn take(pool: &mut ZPool, page: u32) -> Option<Vec<u8>> {
    let mut out = vec![0u8; PAGE_SIZE];
    pool.take(page, &mut out).then_some(out)
}

#[test]
fn a_page_comes_back_byte_for_byte_once() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let mut pool = ZPool::new(64, codec).unwrap();
        for page in 0..10 {
            assert!(pool.insert(page, &compressible(page, 7)), "{codec:?}");
        }
        assert_eq!(pool.stats().pages_held, 10);
        for page in (0..10).rev() {
            let back = take(&mut pool, page);
            assert_eq!(back.unwrap(), compressible(page, 7), "{codec:?} page {page}");
            assert!(take(&mut pool, page).is_none(), "an entry is taken once");
        }
        assert_eq!(pool.stats().bytes_held, 0);
        assert_eq!(pool.chunks_used, 0, "every chunk came back");
    }
}

#[test]
fn an_incompressible_page_is_not_kept() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let mut pool = ZPool::new(64, codec).unwrap();
        assert!(!pool.insert(3, &random(3)), "{codec:?}");
        assert!(take(&mut pool, 3).is_none());
        let stats = pool.stats();
        let counts = (stats.pages_incompressible, stats.pages_held, stats.charged_pages);
        assert_eq!(counts, (1, 0, 0), "{codec:?}");
    }
}

#[test]
fn a_full_pool_drops_its_oldest_and_stays_within_its_limit() {
    let mut pool = ZPool::new(16, Codec::Lz4).unwrap();
    let limit = pool.stats().limit_pages;
    for page in 0..1000 {
        assert!(pool.insert(page, &compressible(page, 1)));
        assert!(pool.charged_pages() as u64 <= limit, "page {page}: over the limit");
    }
    let stats = pool.stats();
    assert!(stats.pages_dropped > 0 && stats.pages_held + stats.pages_dropped == 1000);
    // FIFO: the newest are there, the oldest are not.
    assert!(take(&mut pool, 999).is_some());
    assert!(take(&mut pool, 0).is_none());
    // A fault on a page dropped lately is a ghost hit: a bigger pool would
    // have had it.
    let last_dropped = 1000 - stats.pages_held as u32 - 1;
    pool.far_miss(last_dropped);
    assert_eq!(pool.stats().ghost_hits, 1);
}

#[test]
fn lowering_the_limit_gives_memory_back_and_keeps_the_rest_intact() {
    let mut pool = ZPool::new(64, Codec::Lz4).unwrap();
    pool.set_limit(64);
    for page in 0..400 {
        pool.insert(page, &compressible(page, 2));
    }
    let before = pool.charged_pages();
    pool.set_limit(before / 2);
    assert!(pool.charged_pages() <= before / 2);
    let mut kept = 0;
    for page in 0..400 {
        if let Some(bytes) = take(&mut pool, page) {
            assert_eq!(bytes, compressible(page, 2), "page {page}");
            kept += 1;
        }
    }
    assert!(kept > 0 && kept < 400, "{kept} kept");
    pool.clear();
    assert_eq!((pool.charged_pages(), pool.chunks_used), (0, 0));
}

#[test]
fn removed_ranges_are_gone_both_ways() {
    let mut pool = ZPool::new(64, Codec::Lz4).unwrap();
    for page in 0..50 {
        pool.insert(page, &compressible(page, 3));
    }
    pool.remove_range(10, 5); // fewer pages than entries: page by page
    pool.remove_range(40, 1_000_000); // more: through the entries
    for page in 0..50 {
        let there = take(&mut pool, page).is_some();
        assert_eq!(there, !(10..15).contains(&page) && page < 40, "page {page}");
    }
}

#[test]
fn a_page_put_in_twice_keeps_its_newer_bytes() {
    let mut pool = ZPool::new(64, Codec::Lz4).unwrap();
    pool.insert(5, &compressible(5, 1));
    pool.insert(5, &compressible(5, 9));
    assert_eq!(take(&mut pool, 5).unwrap(), compressible(5, 9));
    assert_eq!(pool.chunks_used, 0);
}

#[test]
fn the_limit_follows_the_cheaper_use_of_memory() {
    let costs = Costs { far_ns: 30_000, pool_ns: 3_000 };
    // Faults on pages the pool dropped just before: it grows.
    let mut pool = ZPool::new(16, Codec::Lz4).unwrap();
    let start = pool.stats().limit_pages;
    for round in 0..4 {
        for page in 0..EPOCH_EVENTS as u32 {
            let page = round * 100_000 + page;
            pool.insert(page, &compressible(page, 4));
        }
        for page in 0..EPOCH_EVENTS as u32 {
            pool.far_miss(round * 100_000 + page);
        }
        pool.adapt(&costs);
    }
    assert!(pool.stats().limit_pages > start, "{} <= {start}", pool.stats().limit_pages);
    // Hits on the newest entries only: memory is better spent resident.
    let mut pool = ZPool::new(256, Codec::Lz4).unwrap();
    let start = pool.stats().limit_pages;
    for page in 0..4 * EPOCH_EVENTS as u32 {
        pool.insert(page, &compressible(page, 5));
        assert!(take(&mut pool, page).is_some());
        pool.adapt(&costs);
    }
    assert!(pool.stats().limit_pages < start, "{} >= {start}", pool.stats().limit_pages);
}

/// Costs of the pool's two hot paths, on text-like pages (run with
/// `--ignored --nocapture`; a measurement, not a check).
#[test]
#[ignore]
fn measure_insert_and_take() {
    let words = ["memory", "lend", "page", "\"field\":", "value", "donor", "fault", "zipf"];
    let page_of = |page: u32| -> Vec<u8> {
        let mut x = u64::from(page) | 1;
        let mut out = Vec::with_capacity(PAGE_SIZE);
        while out.len() < PAGE_SIZE {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(words[(x % 8) as usize].as_bytes());
            out.push(b' ');
        }
        out.truncate(PAGE_SIZE);
        out
    };
    let pages: Vec<Vec<u8>> = (0..4096).map(page_of).collect();
    let mut pool = ZPool::new(4096, Codec::Lz4).unwrap();
    let started = cpu_ns();
    for (page, bytes) in pages.iter().enumerate() {
        pool.insert(page as u32, bytes);
    }
    let insert_ns = (cpu_ns() - started) / 4096;
    let ratio = pool.stats().bytes_held as f64 / pool.stats().pages_held.max(1) as f64;
    let mut out = vec![0u8; PAGE_SIZE];
    let started = cpu_ns();
    let mut taken = 0;
    for page in 0..4096 {
        taken += usize::from(pool.take(page, &mut out));
    }
    let take_ns = (cpu_ns() - started) / taken.max(1) as u64;
    eprintln!(
        "insert {insert_ns} ns, take {take_ns} ns of CPU ({taken} taken), {ratio:.0} B/page in"
    );
    let noise: Vec<Vec<u8>> = (0..4096).map(random).collect();
    let started = cpu_ns();
    for (page, bytes) in noise.iter().enumerate() {
        assert!(!pool.insert(page as u32, bytes));
    }
    eprintln!("refusing a random page: {} ns of CPU", (cpu_ns() - started) / 4096);
}

/// This thread's CPU time: the machine may be busy, and wall time would
/// count the other tasks.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn after_a_run_of_refusals_one_page_in_eight_is_tried() {
    let mut packer = ZPool::new(16, Codec::Lz4).unwrap().packer().unwrap();
    let mut packed = Packed::default();
    for page in 0..32 {
        packer.pack(page, &random(page), &mut packed);
    }
    assert_eq!((packed.refused, packed.pages.len()), (32, 0));
    // Compressible pages again: most are skipped until one tried compresses
    // and the run of refusals thins out.
    let mut tried_before_kept = 0;
    while packed.pages.is_empty() {
        tried_before_kept += 1;
        packer.pack(100, &compressible(100, 1), &mut packed);
    }
    assert!(tried_before_kept <= SAMPLE_EVERY, "{tried_before_kept} pages before one was tried");
    let mut pool = ZPool::new(16, Codec::Lz4).unwrap();
    assert_eq!(pool.insert_packed(&packed, |_| true), 1);
    assert_eq!(take(&mut pool, 100).unwrap(), compressible(100, 1));
    assert!(pool.stats().pages_incompressible >= 32);
}

#[test]
fn packed_pages_the_caller_calls_stale_are_not_kept() {
    let mut packer = ZPool::new(16, Codec::Lz4).unwrap().packer().unwrap();
    let mut packed = Packed::default();
    for page in 0..4 {
        packer.pack(page, &compressible(page, 2), &mut packed);
    }
    let mut pool = ZPool::new(16, Codec::Lz4).unwrap();
    assert_eq!(pool.insert_packed(&packed, |page| page % 2 == 0), 2);
    assert!(take(&mut pool, 1).is_none() && take(&mut pool, 2).is_some());
}
