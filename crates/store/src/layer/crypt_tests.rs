use super::*;
use crate::layer::LocalTags;
use crate::ram::{RamOptions, RamStore};
use crate::Caps;

type Below = LocalTags<RamStore>;

const KEY: [u8; 32] = [0x5a; 32];

fn crypt(pages: u64) -> Crypt<Below> {
    crypt_with(pages, KEY)
}

fn crypt_with(pages: u64, key: [u8; 32]) -> Crypt<Below> {
    let below = LocalTags::new(RamStore::new(pages, RamOptions::default()).unwrap()).unwrap();
    Crypt::new(below, key).unwrap()
}

fn read_run(s: &dyn PageStore, page: u64, count: usize) -> StoreResult<Vec<u8>> {
    let mut buf = vec![0xeeu8; count * PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }])?;
    Ok(buf)
}

fn write_run(s: &dyn PageStore, page: u64, data: &[u8]) {
    s.write(&[WriteOp { page, data }]).unwrap();
}

/// What the store below holds for `page`: the ciphertext and its tag.
fn inner_page(s: &Crypt<Below>, page: u64) -> Vec<u8> {
    inner_sealed(s, page).0
}

fn inner_sealed(s: &Crypt<Below>, page: u64) -> (Vec<u8>, Sidecar) {
    let (mut buf, mut tag) = (vec![0u8; PAGE_SIZE], [[0u8; SIDECAR_LEN]; 1]);
    s.inner().read_with(&mut [ReadOp { page, buf: &mut buf }], &mut tag).unwrap();
    (buf, tag[0])
}

/// Replace the ciphertext below, keeping the tag there.
fn put_inner(s: &Crypt<Below>, page: u64, data: &[u8]) {
    let tag = inner_sealed(s, page).1;
    put_sealed(s, page, data, tag);
}

/// Replace ciphertext and tag below, as a donor could.
fn put_sealed(s: &Crypt<Below>, page: u64, data: &[u8], tag: Sidecar) {
    s.inner().write_with(&[WriteOp { page, data }], &[tag]).unwrap();
}

/// A small deterministic generator (xorshift64), for random contents.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn assert_corrupt(err: StoreError, want_page: u64) {
    let StoreError::Corrupt { page, .. } = err else { panic!("not Corrupt: {err}") };
    assert_eq!(page, want_page);
}

#[test]
fn metadata_is_6_bytes_per_page_and_limits_are_explicit() {
    const { assert!(Crypt::<Below>::METADATA_BYTES_PER_PAGE == 6) };
    let s = crypt(1 << 20);
    assert_eq!(s.metadata_bytes(), 6 << 20);
    assert_eq!(s.info().name, "crypt(local_tags(ram))");
    assert_eq!(
        s.info().caps,
        Caps { durable: false, discard_frees: true, fast: true, checked: true }
    );
    let err = Crypt::new(Huge, KEY).err().expect("2^40 + 1 pages must be refused");
    assert!(matches!(err, StoreError::NoSpace(_)), "{err}");
}

/// A store too large for the nonce; only its size is ever asked.
struct Huge;

impl SidecarStore for Huge {
    fn read_with(&self, _: &mut [ReadOp<'_>], _: &mut [Sidecar]) -> StoreResult<()> {
        unreachable!()
    }
    fn write_with(&self, _: &[WriteOp<'_>], _: &[Sidecar]) -> StoreResult<()> {
        unreachable!()
    }
}

impl PageStore for Huge {
    fn info(&self) -> StoreInfo {
        StoreInfo { pages: (1 << 40) + 1, caps: Caps::default(), name: "huge".into() }
    }
    fn read(&self, _: &mut [ReadOp<'_>]) -> StoreResult<()> {
        unreachable!()
    }
    fn write(&self, _: &[WriteOp<'_>]) -> StoreResult<()> {
        unreachable!()
    }
    fn discard(&self, _: u64, _: u64) -> StoreResult<()> {
        unreachable!()
    }
    fn flush(&self) -> StoreResult<()> {
        unreachable!()
    }
}

#[test]
fn nonce_is_page_low_and_version_high() {
    let n = nonce(0x01_0203_0405, 0x06_0708);
    assert_eq!(n.as_ref(), &[5, 4, 3, 2, 1, 8, 7, 6, 0, 0, 0, 0]);
    let top = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0];
    assert_eq!(nonce((1 << 40) - 1, VERSION_MAX).as_ref(), &top);
}

/// The version word lives in two tables (32 + 16 bits): a version past
/// 2^32 must come back whole, or a nonce would repeat.
#[test]
fn versions_past_32_bits_survive_the_split() {
    let s = crypt(4);
    s.versions.set(1, (1 << 40) + 7);
    write_run(&s, 1, &[5u8; PAGE_SIZE]);
    assert_eq!(s.versions.get(1), (1 << 40) + 8);
    assert_eq!(read_run(&s, 1, 1).unwrap(), [5u8; PAGE_SIZE]);
    s.discard(1, 1).unwrap();
    assert_eq!(s.versions.get(1), ((1 << 40) + 8) | DISCARDED);
}

#[test]
fn random_pages_and_runs_round_trip() {
    const PAGES: u64 = 256;
    let s = crypt(PAGES);
    let mut model = vec![0u8; PAGES as usize * PAGE_SIZE];
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for _ in 0..300 {
        // Two non-overlapping runs of 1..=16 pages, one in each half.
        let runs: Vec<(u64, usize)> = [0, PAGES / 2]
            .iter()
            .map(|&base| (base + rng.below(PAGES / 2 - 16), 1 + rng.below(16) as usize))
            .collect();
        let datas: Vec<Vec<u8>> = runs.iter().map(|&(_, n)| rng.bytes(n * PAGE_SIZE)).collect();
        let ops: Vec<WriteOp<'_>> =
            runs.iter().zip(&datas).map(|(&(page, _), data)| WriteOp { page, data }).collect();
        s.write(&ops).unwrap();
        for (&(page, _), data) in runs.iter().zip(&datas) {
            let at = page as usize * PAGE_SIZE;
            model[at..at + data.len()].copy_from_slice(data);
        }
        let (page, count) = (rng.below(PAGES - 32), 1 + rng.below(32) as usize);
        let at = page as usize * PAGE_SIZE;
        assert_eq!(read_run(&s, page, count).unwrap(), model[at..at + count * PAGE_SIZE]);
    }
    assert_eq!(read_run(&s, 0, PAGES as usize).unwrap(), model);
    assert_eq!(s.corrupt_pages(), 0);
}

#[test]
fn the_store_below_never_holds_the_plaintext() {
    const PATTERN: &[u8; 16] = b"memlend-secret!!";
    let s = crypt(64);
    let data: Vec<u8> = PATTERN.iter().copied().cycle().take(64 * PAGE_SIZE).collect();
    write_run(&s, 0, &data);
    let below = read_run(s.inner(), 0, 64).unwrap();
    assert!(!below.windows(PATTERN.len()).any(|w| w == PATTERN));
    assert!(below.iter().any(|&b| b != 0), "the ciphertext was written below");
    assert_eq!(read_run(&s, 0, 64).unwrap(), data);
}

#[test]
fn a_flipped_bit_below_is_corrupt_counted_and_not_returned() {
    let s = crypt(8);
    let data = [0x42u8; 3 * PAGE_SIZE];
    write_run(&s, 2, &data);
    let mut sealed = inner_page(&s, 3);
    sealed[1000] ^= 0x10;
    put_inner(&s, 3, &sealed);
    let mut buf = vec![0xeeu8; 3 * PAGE_SIZE];
    let err = s.read(&mut [ReadOp { page: 2, buf: &mut buf }]).unwrap_err();
    let StoreError::Corrupt { page, expected, actual } = err else { panic!("{err}") };
    assert_eq!((page, expected, actual), (3, 1, 0), "page 3, version 1");
    assert_eq!(s.corrupt_pages(), 1);
    // The good pages of the batch are still decrypted; the bad one is zeroes.
    assert_eq!(buf[..PAGE_SIZE], data[..PAGE_SIZE]);
    assert!(buf[PAGE_SIZE..2 * PAGE_SIZE].iter().all(|&b| b == 0));
    assert_eq!(buf[2 * PAGE_SIZE..], data[..PAGE_SIZE]);
}

#[test]
fn an_older_ciphertext_of_the_page_is_corrupt() {
    let s = crypt(8);
    write_run(&s, 5, &[1u8; PAGE_SIZE]);
    let v1 = inner_page(&s, 5);
    write_run(&s, 5, &[2u8; PAGE_SIZE]);
    put_inner(&s, 5, &v1);
    assert_corrupt(read_run(&s, 5, 1).unwrap_err(), 5);
    assert_eq!(s.corrupt_pages(), 1);
}

/// A donor that keeps an old ciphertext with its own, valid tag (a
/// rollback) is caught by the version this process holds.
#[test]
fn an_older_ciphertext_with_its_own_tag_is_corrupt() {
    let s = crypt(8);
    write_run(&s, 5, &[1u8; PAGE_SIZE]);
    let (v1, tag1) = inner_sealed(&s, 5);
    write_run(&s, 5, &[2u8; PAGE_SIZE]);
    put_sealed(&s, 5, &v1, tag1);
    assert_corrupt(read_run(&s, 5, 1).unwrap_err(), 5);
    // Put the newest back and the page reads again.
    write_run(&s, 5, &[3u8; PAGE_SIZE]);
    assert_eq!(read_run(&s, 5, 1).unwrap(), [3u8; PAGE_SIZE]);
}

#[test]
fn a_changed_tag_is_corrupt() {
    let s = crypt(8);
    write_run(&s, 2, &[4u8; PAGE_SIZE]);
    let (c, mut tag) = inner_sealed(&s, 2);
    tag[15] ^= 1;
    put_sealed(&s, 2, &c, tag);
    assert_corrupt(read_run(&s, 2, 1).unwrap_err(), 2);
    put_sealed(&s, 2, &c, [0; SIDECAR_LEN]);
    assert_corrupt(read_run(&s, 2, 1).unwrap_err(), 2);
}

#[test]
fn another_pages_ciphertext_is_corrupt() {
    let s = crypt(8);
    // Equal contents and versions: only the page index in the nonce differs.
    write_run(&s, 3, &[7u8; 2 * PAGE_SIZE]);
    let (c3, c4) = (inner_sealed(&s, 3), inner_sealed(&s, 4));
    put_sealed(&s, 3, &c4.0, c4.1);
    put_sealed(&s, 4, &c3.0, c3.1);
    assert_corrupt(read_run(&s, 3, 2).unwrap_err(), 3);
    assert_corrupt(read_run(&s, 4, 1).unwrap_err(), 4);
    assert_eq!(s.corrupt_pages(), 3);
}

#[test]
fn discard_reads_zero_and_keeps_the_version() {
    let s = crypt(8);
    let data = [9u8; PAGE_SIZE];
    write_run(&s, 1, &data);
    let first = inner_page(&s, 1);
    s.discard(1, 2).unwrap();
    assert!(read_run(&s, 1, 2).unwrap().iter().all(|&b| b == 0));
    assert!(inner_page(&s, 1).iter().all(|&b| b == 0), "discarded below too");
    assert_eq!(s.versions.get(2), 0, "a page never written stays untouched");
    assert_eq!(s.versions.get(1), 1 | DISCARDED);
    // The same data again: a new version, so a new nonce and ciphertext.
    write_run(&s, 1, &data);
    assert_eq!(s.versions.get(1), 2);
    assert_ne!(inner_page(&s, 1), first);
    assert_eq!(read_run(&s, 1, 1).unwrap(), data);
}

#[test]
fn pages_never_written_read_zero_whatever_is_below() {
    let s = crypt(8);
    put_inner(&s, 6, &[0xabu8; PAGE_SIZE]);
    assert!(read_run(&s, 6, 1).unwrap().iter().all(|&b| b == 0));
    assert_eq!(s.corrupt_pages(), 0);
}

#[test]
fn different_keys_give_different_ciphertexts() {
    let a = crypt(4);
    let b = crypt_with(4, [0xa5; 32]);
    write_run(&a, 2, &[3u8; PAGE_SIZE]);
    write_run(&b, 2, &[3u8; PAGE_SIZE]);
    let (sa, sb) = (inner_sealed(&a, 2), inner_sealed(&b, 2));
    assert_ne!(sa.0, sb.0);
    assert_ne!(sa.1, sb.1);
}

#[test]
fn rewriting_the_same_data_gives_a_new_ciphertext() {
    let s = crypt(4);
    write_run(&s, 0, &[3u8; PAGE_SIZE]);
    let first = inner_page(&s, 0);
    write_run(&s, 0, &[3u8; PAGE_SIZE]);
    assert_ne!(inner_page(&s, 0), first);
}

#[test]
fn a_page_out_of_versions_refuses_the_whole_batch() {
    let s = crypt(8);
    write_run(&s, 4, &[1u8; 2 * PAGE_SIZE]);
    s.versions.set(5, VERSION_MAX);
    let err = s.write(&[WriteOp { page: 4, data: &[2u8; 2 * PAGE_SIZE] }]).unwrap_err();
    assert!(matches!(err, StoreError::NoSpace(_)), "{err}");
    assert_eq!(s.versions.get(4), 1, "page 4 not re-sealed");
    assert_eq!(read_run(&s, 4, 1).unwrap(), [1u8; PAGE_SIZE]);
}

/// Writers fill pages with one byte value each; readers must always see a
/// page of one value (never torn, never `Corrupt`), in single pages and runs.
#[test]
fn concurrent_writers_and_readers_never_see_torn_or_corrupt_pages() {
    const PAGES: u64 = 8;
    const OPS: u64 = 1500;
    let s = crypt(PAGES);
    std::thread::scope(|scope| {
        for writer in 0..2u64 {
            let s = &s;
            scope.spawn(move || {
                for i in 0..OPS {
                    let (page, count) = (i % PAGES, 1 + i % 3);
                    let count = count.min(PAGES - page);
                    let value = (writer * 100 + i % 100 + 1) as u8;
                    write_run(s, page, &vec![value; count as usize * PAGE_SIZE]);
                    if writer == 1 && i % 50 == 0 {
                        s.discard(page, 1).unwrap();
                    }
                }
            });
        }
        for reader in 0..2u64 {
            let s = &s;
            scope.spawn(move || {
                for i in 0..OPS {
                    let page = (i * 3 + reader) % PAGES;
                    let count = (1 + i % 4).min(PAGES - page) as usize;
                    let buf = read_run(s, page, count).unwrap();
                    for chunk in buf.chunks_exact(PAGE_SIZE) {
                        assert!(chunk.iter().all(|&b| b == chunk[0]), "torn page");
                    }
                }
            });
        }
    });
    assert_eq!(s.corrupt_pages(), 0);
}

/// Below, but the next `garble` reads that return page `page` flip one of
/// its bytes: damage on the way, not at rest.
struct OnTheWay {
    below: Below,
    page: u64,
    garble: std::sync::atomic::AtomicU32,
}

impl SidecarStore for OnTheWay {
    fn read_with(&self, ops: &mut [ReadOp<'_>], side: &mut [Sidecar]) -> StoreResult<()> {
        self.below.read_with(ops, side)?;
        for op in ops.iter_mut() {
            let pages = op.page..op.page + (op.buf.len() / PAGE_SIZE) as u64;
            let left = self.garble.load(Relaxed);
            if pages.contains(&self.page) && left > 0 {
                self.garble.store(left - 1, Relaxed);
                op.buf[(self.page - op.page) as usize * PAGE_SIZE + 7] ^= 1;
            }
        }
        Ok(())
    }
    fn write_with(&self, ops: &[WriteOp<'_>], side: &[Sidecar]) -> StoreResult<()> {
        self.below.write_with(ops, side)
    }
}

impl PageStore for OnTheWay {
    fn info(&self) -> StoreInfo {
        self.below.info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.below.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.below.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.below.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        self.below.flush()
    }
}

/// The page protocol leaves a sealed page's check to its tag, so a page
/// damaged once on the way is read again and comes back right, uncounted;
/// damaged on the second read too, it is `Corrupt` and counted once.
#[test]
fn a_page_damaged_on_the_way_is_read_again() {
    for (garble, corrupt) in [(1, false), (2, true)] {
        let below = LocalTags::new(RamStore::new(8, RamOptions::default()).unwrap()).unwrap();
        let none = std::sync::atomic::AtomicU32::new(0);
        let s = Crypt::new(OnTheWay { below, page: 3, garble: none }, KEY).unwrap();
        let data: Vec<u8> = (0..3 * PAGE_SIZE).map(|i| (i % 253) as u8).collect();
        write_run(&s, 2, &data);
        s.inner().garble.store(garble, Relaxed);
        let got = read_run(&s, 2, 3);
        match corrupt {
            false => assert!(got.unwrap() == data, "read again, right"),
            true => assert_corrupt(got.unwrap_err(), 3),
        }
        assert_eq!(s.corrupt_pages(), u64::from(corrupt));
        assert_eq!(s.inner().garble.load(Relaxed), 0, "read {garble} times");
    }
}
