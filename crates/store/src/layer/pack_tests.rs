use super::*;
use crate::layer::flaky::Flaky;
use crate::layer::remap_tests::*;
use crate::ram::{RamOptions, RamStore};
use std::sync::atomic::Ordering::SeqCst;

fn ram(pages: u64) -> RamStore {
    RamStore::new(pages, RamOptions::default()).unwrap()
}

/// Writes 8 pages at a time, with as few bins to spare as it may have:
/// bins are reused often.
fn pack(pages: u64, codec: Codec) -> Pack<RamStore> {
    Pack::with_chunk(ram(pages + slack_bins(pages, 8)), pages, codec, 8).unwrap()
}

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A page that starts with `tag` and is, by `tag % 4`: text of words
/// (compresses 2-3x), random bytes (does not compress), nearly empty, or
/// text again. Each tag gives its own bytes.
fn page_of(tag: u64) -> Vec<u8> {
    let mut page = tag.to_le_bytes().to_vec();
    let mut next = xorshift(tag | 1);
    let words = ["donor", "page", "fault", "memory", "the", "store", "lend", "a"];
    match tag % 4 {
        1 => {
            while page.len() < PAGE_SIZE {
                page.extend_from_slice(&next().to_le_bytes());
            }
        }
        2 => page.resize(PAGE_SIZE, 0),
        _ => {
            while page.len() < PAGE_SIZE {
                page.extend_from_slice(words[(next() % 8) as usize].as_bytes());
                page.push(b' ');
            }
        }
    }
    page.truncate(PAGE_SIZE);
    page
}

fn read_one(s: &impl PageStore, page: u64) -> Vec<u8> {
    let mut buf = vec![0xAAu8; PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
    buf
}

#[test]
fn every_kind_of_page_reads_back_with_either_codec() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let s = pack(64, codec);
        assert_eq!(s.info().pages, 64);
        assert_eq!(read_one(&s, 5), vec![0; PAGE_SIZE], "never written");
        let data: Vec<u8> = (0..16).flat_map(page_of).chain(vec![0; PAGE_SIZE]).collect();
        s.write(&[WriteOp { page: 10, data: &data }]).unwrap();
        for i in 0..16 {
            assert_eq!(read_one(&s, 10 + i), page_of(i), "{codec:?} page {i}");
        }
        assert_eq!(read_one(&s, 26), vec![0; PAGE_SIZE], "{codec:?}: a page of zeroes");
        let mut all = vec![0u8; 17 * PAGE_SIZE];
        s.read(&mut [ReadOp { page: 10, buf: &mut all }]).unwrap();
        assert!(all == data, "{codec:?}: one read of the whole run");
        s.discard(12, 2).unwrap();
        assert_eq!(read_one(&s, 12), vec![0; PAGE_SIZE]);
        assert_eq!(read_one(&s, 14), page_of(4));
    }
}

#[test]
fn text_takes_fewer_pages_below_and_random_bytes_no_more() {
    let s = pack(256, Codec::Lz4);
    let text: Vec<u8> = (0..64).flat_map(|i| page_of(i * 4)).collect();
    s.write(&[WriteOp { page: 0, data: &text }]).unwrap();
    let bins = s.map.lock().bins_live();
    assert!(bins <= 32, "64 pages of text took {bins} pages below");
    let random: Vec<u8> = (0..64).flat_map(|i| page_of(i * 4 + 1)).collect();
    s.write(&[WriteOp { page: 64, data: &random }]).unwrap();
    assert_eq!(s.map.lock().bins_live(), bins + 64, "a random page takes one page below");
    assert!(s.summary().contains("128 pages written"), "{}", s.summary());
    for i in 0..64 {
        assert_eq!(read_one(&s, i), page_of(i * 4));
        assert_eq!(read_one(&s, 64 + i), page_of(i * 4 + 1));
    }
}

/// Random writes, reads and discards against a model, on a store small
/// enough that bins empty, wait in quarantine and are reused many times.
#[test]
fn random_operations_match_a_model_through_bin_reuse() {
    let pages = 96;
    let s = pack(pages, Codec::Lz4);
    random_operations_match_a_model(&s, page_of);
    let map = s.map.lock();
    let entries = map.loc_of.iter().filter(|&&at| at != NONE).count();
    let live: usize = map.live.iter().map(|&n| usize::from(n)).sum();
    assert_eq!(live, entries, "every live entry counted in its bin, and nothing else");
}

/// Tags that are text (`tag % 4 == 0`), so several share a bin.
#[test]
fn reads_racing_rewrites_get_whole_pages_of_their_own() {
    let below = SlowReads(ram(64 + 8));
    let versions =
        Versions { tag: |p, v| (p << 32 | v) << 2, page_of_tag: |t| t >> 34, bytes: page_of };
    let s = Pack::with_chunk(below, 64, Codec::Lz4, 8).unwrap();
    reads_racing_rewrites_get_whole_pages(Arc::new(s), versions);
}

#[test]
fn a_failed_write_keeps_the_old_bytes_and_frees_its_bins() {
    let pages = 16;
    let below = Flaky::new(pages + 8);
    let s = Pack::with_chunk(Arc::clone(&below), pages, Codec::Lz4, 8).unwrap();
    s.write(&[WriteOp { page: 3, data: &page_of(1) }]).unwrap();
    below.dead.store(true, SeqCst);
    let all: Vec<u8> = (0..pages).flat_map(|p| page_of(p * 4 + 1)).collect();
    assert!(s.write(&[WriteOp { page: 0, data: &all }]).is_err());
    below.dead.store(false, SeqCst);
    assert_eq!(read_one(&s, 3), page_of(1));
    // Were the failed write's bins still taken, these would find none.
    for round in 0..4 {
        let data: Vec<u8> = (0..pages).flat_map(|p| page_of((p + round) * 4 + 1)).collect();
        s.write(&[WriteOp { page: 0, data: &data }]).unwrap();
    }
    assert_eq!(read_one(&s, 3), page_of((3 + 3) * 4 + 1));
}

/// A bin changed below the layer (a store that does not check its pages)
/// fails the pages packed in it, zeroed, and returns the others.
#[test]
fn a_bin_that_does_not_decode_fails_its_pages_and_returns_the_rest() {
    let base = Arc::new(ram(24));
    let s = Pack::with_chunk(Arc::clone(&base), 16, Codec::Lz4, 8).unwrap();
    let text: Vec<u8> = [page_of(0), page_of(4), page_of(9)].concat();
    s.write(&[WriteOp { page: 0, data: &text }]).unwrap();
    let bins: Vec<u32> = (0..3).map(|p| bin_of(s.map.lock().loc_of[p])).collect();
    assert!(bins[2] != bins[0] && bins[2] != bins[1], "a random page has a bin of its own");
    base.write(&[WriteOp { page: u64::from(bins[0]), data: &[0x5Au8; PAGE_SIZE] }]).unwrap();
    let mut got = vec![0xAAu8; 3 * PAGE_SIZE];
    let res = s.read(&mut [ReadOp { page: 0, buf: &mut got }]);
    assert!(matches!(res, Err(StoreError::Corrupt { page: 0, .. })), "{res:?}");
    for (i, want) in [page_of(0), page_of(4), page_of(9)].into_iter().enumerate() {
        let want = if bins[i] == bins[0] { vec![0; PAGE_SIZE] } else { want };
        assert!(got[i * PAGE_SIZE..(i + 1) * PAGE_SIZE] == want, "page {i}");
    }
}

#[test]
fn a_store_below_too_small_and_bad_requests_are_refused() {
    let err = Pack::new(ram(300), 64, Codec::Lz4).err().unwrap();
    assert!(err.to_string().contains("need 320 pages below"), "{err}");
    let s = pack(8, Codec::Lz4);
    assert!(matches!(
        s.write(&[WriteOp { page: 8, data: &page_of(0) }]),
        Err(StoreError::OutOfRange { .. })
    ));
    assert!(s.discard(7, 2).is_err());
    let mut short = vec![0u8; 100];
    assert!(s.read(&mut [ReadOp { page: 0, buf: &mut short }]).is_err());
}

/// Random bytes only: after a run of refusals, most pages are not tried.
#[test]
fn random_data_stops_being_compressed_after_a_while() {
    let s = pack(512, Codec::Lz4);
    for i in 0..256u64 {
        s.write(&[WriteOp { page: i, data: &page_of(i * 4 + 1) }]).unwrap();
    }
    let tried = s.tried.load(Relaxed);
    assert!(tried > 150, "only {tried} pages skipped the codec");
    for i in 0..256u64 {
        assert_eq!(read_one(&s, i), page_of(i * 4 + 1));
    }
}

/// Over a checked store (crypt), a page that fails below is zeroed and
/// named by this store's page number, raw or packed, and the rest return.
#[test]
fn over_a_checked_store_a_failed_page_is_named_as_this_store_knows_it() {
    let base = Arc::new(ram(24));
    let crypt =
        crate::layer::Crypt::new(crate::layer::LocalTags::new(Arc::clone(&base)).unwrap(), [7; 32]);
    let s = Pack::with_chunk(crypt.unwrap(), 16, Codec::Lz4, 8).unwrap();
    let data: Vec<u8> = [page_of(1), page_of(0), page_of(5)].concat();
    s.write(&[WriteOp { page: 4, data: &data }]).unwrap();
    let raw_bin = bin_of(s.map.lock().loc_of[4]);
    base.write(&[WriteOp { page: u64::from(raw_bin), data: &page_of(99) }]).unwrap();
    let mut got = vec![0xAAu8; 3 * PAGE_SIZE];
    let res = s.read(&mut [ReadOp { page: 4, buf: &mut got }]);
    assert!(matches!(res, Err(StoreError::Corrupt { page: 4, .. })), "{res:?}");
    assert!(got[..PAGE_SIZE] == vec![0; PAGE_SIZE], "the failed raw page, zeroed");
    assert!(got[PAGE_SIZE..] == [page_of(0), page_of(5)].concat(), "the others, returned");
}

/// Four writers rewrite their own pages with random bytes (a bin each)
/// through a store with only a chunk of bins to spare: a chunk that finds
/// too few free bins waits for the others to settle, and no write fails.
#[test]
fn writers_that_find_no_free_bin_wait_for_one_and_none_fails() {
    let pages = 64u64;
    let s = Arc::new(pack(pages, Codec::Lz4));
    let threads: Vec<_> = (0..4u64)
        .map(|w| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for round in 0..200u64 {
                    let data: Vec<u8> =
                        (0..16).flat_map(|i| page_of((round << 20 | w << 8 | i) * 4 + 1)).collect();
                    s.write(&[WriteOp { page: w * 16, data: &data }]).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    for w in 0..4u64 {
        for i in 0..16 {
            assert_eq!(read_one(&*s, w * 16 + i), page_of((199 << 20 | w << 8 | i) * 4 + 1));
        }
    }
    assert_eq!(s.map.lock().in_flight, 0);
}

proptest::proptest! {
    /// Whatever bytes the store below hands back for a bin (a donor that
    /// lies, with `--no-encrypt`), a read never panics: each page comes
    /// back as written, or zeroed with an error, or, where the bytes happen
    /// to decode to a page, as that page (only a checked store below, such
    /// as `crypt`, the default for donors, can tell those).
    #[test]
    fn any_bytes_below_are_pages_or_errors_never_a_panic(
        garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..PAGE_SIZE),
        at in 0usize..PAGE_SIZE,
    ) {
        let base = Arc::new(ram(24));
        let s = Pack::with_chunk(Arc::clone(&base), 16, Codec::Lz4, 8).unwrap();
        let data: Vec<u8> = (0..8).flat_map(|i| page_of(i * 4)).collect();
        s.write(&[WriteOp { page: 0, data: &data }]).unwrap();
        let mut bin = vec![0u8; PAGE_SIZE];
        let n = garbage.len().min(PAGE_SIZE - at);
        bin[at..at + n].copy_from_slice(&garbage[..n]);
        base.write(&[WriteOp { page: u64::from(bin_of(s.map.lock().loc_of[0])), data: &bin }]).unwrap();
        let mut got = vec![0xAAu8; 8 * PAGE_SIZE];
        let res = s.read(&mut [ReadOp { page: 0, buf: &mut got }]);
        for (i, page) in got.chunks(PAGE_SIZE).enumerate() {
            let whole = page == page_of(i as u64 * 4).as_slice();
            let zeroed = page.iter().all(|&b| b == 0);
            proptest::prop_assert!(whole || zeroed || res.is_ok(), "page {} neither", i);
        }
    }
}

/// Bins freed by rewrites are reused before bins never used, so the pages
/// below ever touched (a donor's memory, a file's blocks) stay near the
/// most in use at once, not the pages ever written.
#[test]
fn rewrites_reuse_freed_bins_so_few_are_ever_used() {
    let s = pack(4096, Codec::Lz4);
    for round in 0..100u64 {
        for batch in 0..8u64 {
            let data: Vec<u8> =
                (0..8).flat_map(|i| page_of((round << 16 | batch << 8 | i) * 4 + 1)).collect();
            s.write(&[WriteOp { page: batch * 8, data: &data }]).unwrap();
        }
    }
    let map = s.map.lock();
    assert_eq!(map.bins_live(), 64);
    assert!(map.fresh <= 64 + 16, "{} bins ever used for 64 pages rewritten 100 times", map.fresh);
}

/// Pages of text rewritten one at a time, at random, leave bins part
/// empty; the cleaner repacks them, so the pages below stay near what the
/// live bytes need, and every page reads back as last written.
#[test]
fn the_cleaner_holds_the_ratio_under_rewrites() {
    let pages = 512u64;
    let s = pack(pages, Codec::Lz4);
    let mut last: Vec<u64> = (0..pages).map(|p| p << 20).collect();
    let all: Vec<u8> = last.iter().flat_map(|&t| page_of(t * 4)).collect();
    s.write(&[WriteOp { page: 0, data: &all }]).unwrap();
    let mut next = xorshift(7);
    for step in 1..=4000u64 {
        let page = next() % pages;
        last[page as usize] = page << 20 | step;
        s.write(&[WriteOp { page, data: &page_of(last[page as usize] * 4) }]).unwrap();
    }
    for page in 0..pages {
        assert_eq!(read_one(&s, page), page_of(last[page as usize] * 4), "page {page}");
    }
    let summary = s.summary();
    let map = s.map.lock();
    let live_bytes: usize = map.live_bytes.iter().map(|&b| usize::from(b)).sum();
    let need = live_bytes.div_ceil(PAGE_SIZE);
    let held = map.bins_live();
    println!("{pages} pages: {held} bins hold them, {need} by their bytes; {summary}");
    assert!(s.counts.pages_moved.load(Relaxed) > 0, "the cleaner moved nothing");
    assert!(held * 2 <= need * 3, "{held} bins for {need} bins' worth of live bytes");
}
