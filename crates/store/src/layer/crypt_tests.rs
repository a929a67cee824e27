use super::*;
use crate::ram::{RamOptions, RamStore};
use crate::Caps;

const KEY: [u8; 32] = [0x5a; 32];

fn crypt(pages: u64) -> Crypt<RamStore> {
    Crypt::new(RamStore::new(pages, RamOptions::default()).unwrap(), KEY).unwrap()
}

fn read_run(s: &dyn PageStore, page: u64, count: usize) -> StoreResult<Vec<u8>> {
    let mut buf = vec![0xeeu8; count * PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }])?;
    Ok(buf)
}

fn write_run(s: &dyn PageStore, page: u64, data: &[u8]) {
    s.write(&[WriteOp { page, data }]).unwrap();
}

/// What the store below holds for `page`: the ciphertext.
fn inner_page(s: &Crypt<RamStore>, page: u64) -> Vec<u8> {
    read_run(s.inner(), page, 1).unwrap()
}

fn put_inner(s: &Crypt<RamStore>, page: u64, data: &[u8]) {
    write_run(s.inner(), page, data);
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
fn metadata_is_24_bytes_per_page_and_limits_are_explicit() {
    const { assert!(Crypt::<RamStore>::METADATA_BYTES_PER_PAGE == 24) };
    let s = crypt(1 << 20);
    assert_eq!(s.metadata_bytes(), 24 << 20);
    assert_eq!(s.info().name, "crypt(ram)");
    assert_eq!(s.info().caps, Caps { durable: false, discard_frees: true, fast: true });
    let err = Crypt::new(Huge, KEY).err().expect("2^40 + 1 pages must be refused");
    assert!(matches!(err, StoreError::NoSpace(_)), "{err}");
}

/// A store too large for the nonce; only its size is ever asked.
struct Huge;

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
    assert_eq!(nonce((1 << 40) - 1, MAX_VERSION).as_ref(), &[0xff; 12]);
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
    let tag = s.meta[3].tag();
    let want = (3, u32::from_le_bytes(tag.as_ref()[..4].try_into().unwrap()), 0);
    assert_eq!((page, expected, actual), want);
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

#[test]
fn another_pages_ciphertext_is_corrupt() {
    let s = crypt(8);
    // Equal contents and versions: only the page index in the nonce differs.
    write_run(&s, 3, &[7u8; 2 * PAGE_SIZE]);
    let (c3, c4) = (inner_page(&s, 3), inner_page(&s, 4));
    put_inner(&s, 3, &c4);
    put_inner(&s, 4, &c3);
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
    assert_eq!(s.meta[2].word.load(Relaxed), 0, "a page never written stays untouched");
    // The same data again: a new version, so a new nonce and ciphertext.
    write_run(&s, 1, &data);
    assert_eq!(s.meta[1].word.load(Relaxed), 2);
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
    let b = Crypt::new(RamStore::new(4, RamOptions::default()).unwrap(), [0xa5; 32]).unwrap();
    write_run(&a, 2, &[3u8; PAGE_SIZE]);
    write_run(&b, 2, &[3u8; PAGE_SIZE]);
    assert_ne!(inner_page(&a, 2), inner_page(&b, 2));
    assert_ne!(a.meta[2].tag().as_ref(), b.meta[2].tag().as_ref());
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
    s.meta[5].word.store(MAX_VERSION, Relaxed);
    let err = s.write(&[WriteOp { page: 4, data: &[2u8; 2 * PAGE_SIZE] }]).unwrap_err();
    assert!(matches!(err, StoreError::NoSpace(_)), "{err}");
    assert_eq!(s.meta[4].word.load(Relaxed), 1, "page 4 not re-sealed");
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
