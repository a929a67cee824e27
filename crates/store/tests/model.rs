//! Every backend and layer stack, held against a model of what a page store
//! means: a map from page to bytes, where a missing page reads as zeroes.
//!
//! Also: pages are never torn under concurrent writers, the checksum layer
//! catches corruption made behind its back, bad requests change nothing, and
//! the `ram` backend is sparse.

use memlend_store::file::{FileOptions, FileStore};
use memlend_store::layer::{Checksum, Crypt, Erasure, LocalTags, Mirror, MirrorOptions, Stats};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, StoreError, WriteOp, PAGE_SIZE};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tempfile::TempDir;

/// A store under test and the temporary directory that must outlive it.
struct Subject {
    store: Box<dyn PageStore>,
    _dir: Option<TempDir>,
}

fn ram(pages: u64) -> RamStore {
    RamStore::new(pages, RamOptions::default()).unwrap()
}

/// A file store in a fresh directory under `parent`; `None` where that
/// filesystem refuses O_DIRECT.
fn file_in(parent: &Path, pages: u64, direct: bool) -> Option<(FileStore, TempDir)> {
    let dir = tempfile::tempdir_in(parent).unwrap();
    match FileStore::create(&dir.path().join("pages"), pages, FileOptions { direct }) {
        Ok(store) => Some((store, dir)),
        Err(StoreError::Unavailable(why)) if direct => {
            eprintln!("no O_DIRECT subject: {why}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Two RAM legs, mirrored.
fn mirror(pages: u64) -> Mirror {
    let legs: Vec<(Arc<dyn PageStore>, String)> =
        (0..2).map(|i| (Arc::new(ram(pages)) as Arc<dyn PageStore>, format!("ram{i}"))).collect();
    Mirror::new(legs, pages, MirrorOptions::default(), None).unwrap()
}

/// Two data legs and one parity leg, in RAM.
fn erasure(pages: u64) -> Erasure {
    let leg = |i| (Arc::new(ram(pages.div_ceil(2))) as Arc<dyn PageStore>, format!("ram{i}"));
    Erasure::new(vec![leg(0), leg(1)], vec![leg(2)], pages, None).unwrap()
}

/// How a test wraps a file store: which layers, in which order.
type Stack = fn(FileStore) -> Box<dyn PageStore>;

/// Every backend and a spread of layer stacks, each `pages` pages large.
fn subjects(pages: u64) -> Vec<Subject> {
    let tmp = std::env::temp_dir();
    let mut all = vec![
        Subject { store: Box::new(ram(pages)), _dir: None },
        Subject { store: Box::new(Stats::new(ram(pages))), _dir: None },
        Subject { store: Box::new(Checksum::new(Stats::new(ram(pages))).unwrap()), _dir: None },
        Subject { store: Box::new(mirror(pages)), _dir: None },
        Subject { store: Box::new(erasure(pages)), _dir: None },
        Subject {
            store: Box::new(
                Crypt::new(LocalTags::new(Stats::new(ram(pages))).unwrap(), [1; 32]).unwrap(),
            ),
            _dir: None,
        },
    ];
    let stacks: [(bool, Stack); 5] = [
        (false, |f| Box::new(f)),
        (true, |f| Box::new(f)),
        (false, |f| Box::new(Stats::new(Checksum::new(f).unwrap()))),
        (true, |f| Box::new(Checksum::new(Arc::new(f) as Arc<dyn PageStore>).unwrap())),
        (true, |f| Box::new(Crypt::new(LocalTags::new(f).unwrap(), [2; 32]).unwrap())),
    ];
    for (direct, stack) in stacks {
        if let Some((file, dir)) = file_in(&tmp, pages, direct) {
            all.push(Subject { store: stack(file), _dir: Some(dir) });
        }
    }
    // tmpfs, where there is one: another filesystem's holes and O_DIRECT.
    let shm = Path::new("/dev/shm");
    for direct in [false, true] {
        if let Some((file, dir)) = shm.is_dir().then(|| file_in(shm, pages, direct)).flatten() {
            all.push(Subject { store: Box::new(Checksum::new(file).unwrap()), _dir: Some(dir) });
        }
    }
    all
}

/// The bytes a test writes to `page` for `seed`: distinct per page and seed.
fn fill(page: u64, seed: u8) -> Vec<u8> {
    let mut x = page.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(seed) ^ 0x5555;
    (0..PAGE_SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A buffer of `len` bytes that starts page-aligned, or 8 bytes past that
/// (which no O_DIRECT alignment accepts).
struct Buf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl Buf {
    fn new(len: usize, aligned: bool) -> Buf {
        let raw = vec![0u8; len + 2 * PAGE_SIZE];
        let start = raw.as_ptr().align_offset(PAGE_SIZE) + if aligned { 0 } else { 8 };
        Buf { raw, start, len }
    }
    fn bytes(&self) -> &[u8] {
        &self.raw[self.start..][..self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..][..self.len]
    }
}

#[derive(Clone, Debug)]
enum Action {
    Write { runs: Vec<(u64, u64)>, seed: u8, aligned: bool },
    Read { runs: Vec<(u64, u64)>, aligned: bool },
    Discard { page: u64, count: u64 },
    Flush,
}

#[derive(Default)]
struct Model {
    pages: HashMap<u64, Vec<u8>>,
}

impl Model {
    fn page(&self, page: u64) -> Vec<u8> {
        self.pages.get(&page).cloned().unwrap_or_else(|| vec![0; PAGE_SIZE])
    }
}

const PAGES: u64 = 40;

/// Runs of one batch: they may reach past the end (a bad request) but never
/// overlap one another (the interface's rule for callers).
fn runs() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..PAGES + 2, 1u64..=5), 1..5).prop_map(|runs| {
        let mut kept: Vec<(u64, u64)> = Vec::new();
        for (p, c) in runs {
            if kept.iter().all(|&(q, d)| p + c <= q || q + d <= p) {
                kept.push((p, c));
            }
        }
        kept
    })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (runs(), any::<u8>(), any::<bool>())
            .prop_map(|(runs, seed, aligned)| Action::Write { runs, seed, aligned }),
        4 => (runs(), any::<bool>()).prop_map(|(runs, aligned)| Action::Read { runs, aligned }),
        2 => (0..PAGES + 2, 0u64..12).prop_map(|(page, count)| Action::Discard { page, count }),
        1 => Just(Action::Flush),
    ]
}

fn in_range(runs: &[(u64, u64)]) -> bool {
    runs.iter().all(|&(p, c)| p + c <= PAGES)
}

/// Apply one action to the store and the model; describe any disagreement.
fn step(store: &dyn PageStore, model: &mut Model, action: &Action) -> Result<(), String> {
    match action {
        Action::Write { runs, seed, aligned } => {
            let bufs: Vec<Buf> = runs.iter().map(|&(p, c)| filled(p, c, *seed, *aligned)).collect();
            let ops: Vec<WriteOp> = runs
                .iter()
                .zip(&bufs)
                .map(|(&(page, _), b)| WriteOp { page, data: b.bytes() })
                .collect();
            let result = store.write(&ops);
            expect_outcome(result, in_range(runs))?;
            if in_range(runs) {
                for &(p, c) in runs {
                    model.pages.extend((p..p + c).map(|q| (q, fill(q, *seed))));
                }
            }
        }
        Action::Read { runs, aligned } => {
            let mut bufs: Vec<Buf> =
                runs.iter().map(|&(_, c)| Buf::new(c as usize * PAGE_SIZE, *aligned)).collect();
            let mut ops: Vec<ReadOp> = runs
                .iter()
                .zip(&mut bufs)
                .map(|(&(page, _), b)| ReadOp { page, buf: b.bytes_mut() })
                .collect();
            let result = store.read(&mut ops);
            expect_outcome(result, in_range(runs))?;
            if in_range(runs) {
                for (&(p, c), buf) in runs.iter().zip(&bufs) {
                    check_pages(model, p, c, buf.bytes())?;
                }
            }
        }
        Action::Discard { page, count } => {
            let valid = page + count <= PAGES;
            expect_outcome(store.discard(*page, *count), valid)?;
            if valid {
                (*page..page + count).for_each(|p| drop(model.pages.remove(&p)));
            }
        }
        Action::Flush => store.flush().map_err(|e| format!("flush: {e}"))?,
    }
    Ok(())
}

fn filled(page: u64, count: u64, seed: u8, aligned: bool) -> Buf {
    let mut buf = Buf::new(count as usize * PAGE_SIZE, aligned);
    for (i, chunk) in buf.bytes_mut().chunks_exact_mut(PAGE_SIZE).enumerate() {
        chunk.copy_from_slice(&fill(page + i as u64, seed));
    }
    buf
}

fn expect_outcome(result: Result<(), StoreError>, valid: bool) -> Result<(), String> {
    match (result, valid) {
        (Ok(()), true) | (Err(StoreError::OutOfRange { .. }), false) => Ok(()),
        (result, _) => Err(format!("got {result:?}, the request was valid: {valid}")),
    }
}

fn check_pages(model: &Model, first: u64, count: u64, got: &[u8]) -> Result<(), String> {
    for (i, chunk) in got.chunks_exact(PAGE_SIZE).enumerate().take(count as usize) {
        if chunk != model.page(first + i as u64) {
            return Err(format!("page {} differs from the model", first + i as u64));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_store_behaves_like_the_model(actions in prop::collection::vec(action(), 1..40)) {
        for subject in subjects(PAGES) {
            let store = &*subject.store;
            let name = store.info().name;
            let mut model = Model::default();
            for (i, action) in actions.iter().enumerate() {
                let outcome = step(store, &mut model, action);
                let why = outcome.err().unwrap_or_default();
                prop_assert!(why.is_empty(), "{name}, action {i} {action:?}: {why}");
            }
            let mut all = vec![0u8; PAGES as usize * PAGE_SIZE];
            store.read(&mut [ReadOp { page: 0, buf: &mut all }]).unwrap();
            let outcome = check_pages(&model, 0, PAGES, &all);
            prop_assert!(outcome.is_ok(), "{name} at the end: {}", outcome.unwrap_err());
        }
    }
}

/// Pages shared by all threads in the concurrency test.
const SHARED_PAGES: u64 = 8;
const THREADS: u64 = 4;
const ROUNDS: u64 = 1500;

/// A page every 8-byte word of which is `version`.
fn versioned(version: u64) -> Vec<u8> {
    version.to_le_bytes().repeat(PAGE_SIZE / 8)
}

/// The version of a page all of whose words agree; `None` for a torn page.
fn version_of(page: &[u8]) -> Option<u64> {
    let first = &page[..8];
    page.chunks_exact(8).all(|w| w == first).then(|| u64::from_le_bytes(first.try_into().unwrap()))
}

/// One thread's share: write two-page runs of shared pages, read three-page
/// runs and check that each page is one whole version, sometimes discard;
/// and write and read back a page of its own.
fn hammer(store: &dyn PageStore, thread: u64) {
    let mut x = thread.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    for round in 0..ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let page = x % (SHARED_PAGES - 2);
        let version = (thread << 32) | round;
        let data = [versioned(version), versioned(version + (1 << 48))].concat();
        store.write(&[WriteOp { page, data: &data }]).unwrap();
        let mut seen = vec![0u8; 3 * PAGE_SIZE];
        store.read(&mut [ReadOp { page: x % (SHARED_PAGES - 3), buf: &mut seen }]).unwrap();
        for chunk in seen.chunks_exact(PAGE_SIZE) {
            let v =
                version_of(chunk).unwrap_or_else(|| panic!("torn page in {}", store.info().name));
            assert!(v == 0 || (v >> 32 & 0xffff) < THREADS, "a version nobody wrote: {v:#x}");
        }
        if round % 64 == 0 {
            store.discard(x % SHARED_PAGES, 1).unwrap();
        }
        let own = SHARED_PAGES + thread;
        store.write(&[WriteOp { page: own, data: &versioned(version) }]).unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        store.read(&mut [ReadOp { page: own, buf: &mut back }]).unwrap();
        assert_eq!(version_of(&back), Some(version), "own page in {}", store.info().name);
    }
}

#[test]
fn concurrent_writers_never_tear_a_page_nor_trip_the_checksum() {
    for subject in subjects(SHARED_PAGES + THREADS) {
        let store = &*subject.store;
        std::thread::scope(|s| {
            for thread in 0..THREADS {
                s.spawn(move || hammer(store, thread));
            }
        });
    }
}

/// Write through `checksum`, change the file behind it, read: `Corrupt`.
#[test]
fn checksum_catches_a_file_changed_behind_its_back() {
    use std::os::unix::fs::FileExt;
    for direct in [false, true] {
        let Some((file, dir)) = file_in(&std::env::temp_dir(), 8, direct) else { continue };
        let store = Stats::new(Checksum::new(file).unwrap());
        let data = filled(2, 3, 1, true);
        store.write(&[WriteOp { page: 2, data: data.bytes() }]).unwrap();
        let raw = std::fs::OpenOptions::new().write(true).open(dir.path().join("pages")).unwrap();
        raw.write_all_at(&[0xff; 16], 3 * PAGE_SIZE as u64 + 100).unwrap();
        let mut buf = vec![0u8; 3 * PAGE_SIZE];
        let err = store.read(&mut [ReadOp { page: 2, buf: &mut buf }]).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { page: 3, .. }), "{err}");
        assert_eq!(err.errno(), libc::EIO);
        assert_eq!(store.inner().corrupt_pages(), 1);
        assert_eq!(store.snapshot().read.errors, 1);
        // The pages around it are fine, and a rewrite heals the page.
        let mut one = vec![0u8; PAGE_SIZE];
        store.read(&mut [ReadOp { page: 4, buf: &mut one }]).unwrap();
        assert_eq!(one, fill(4, 1));
        store.write(&[WriteOp { page: 3, data: &fill(3, 9) }]).unwrap();
        store.read(&mut [ReadOp { page: 3, buf: &mut one }]).unwrap();
        assert_eq!(one, fill(3, 9));
    }
}

/// Requests that are out of range, misaligned or overflow fail with the
/// right error and change nothing, in every store.
#[test]
fn bad_requests_fail_and_change_nothing() {
    const N: u64 = 16;
    for subject in subjects(N) {
        let store = &*subject.store;
        let name = store.info().name;
        let page = fill(0, 3);
        let two = [fill(0, 3), fill(1, 3)].concat();
        let out_of_range: [&[WriteOp]; 4] = [
            &[WriteOp { page: N, data: &page }],
            &[WriteOp { page: 0, data: &two }, WriteOp { page: N - 1, data: &two }],
            &[WriteOp { page: u64::MAX, data: &page }],
            &[WriteOp { page: u64::MAX - 1, data: &two }],
        ];
        for ops in out_of_range {
            assert!(matches!(store.write(ops), Err(StoreError::OutOfRange { .. })), "{name}");
        }
        for len in [0, 100, PAGE_SIZE + 1] {
            let bad = vec![1u8; len];
            let ops = [WriteOp { page: 1, data: &two }, WriteOp { page: 4, data: &bad }];
            assert!(
                matches!(store.write(&ops), Err(StoreError::Misaligned { .. })),
                "{name} {len}"
            );
            let mut buf = vec![0u8; len];
            let err = store.read(&mut [ReadOp { page: 0, buf: &mut buf }]);
            assert!(matches!(err, Err(StoreError::Misaligned { .. })), "{name} {len}");
        }
        for (p, c) in [(N, 1), (N - 1, 2), (u64::MAX - 1, 5), (1, u64::MAX)] {
            assert!(
                matches!(store.discard(p, c), Err(StoreError::OutOfRange { .. })),
                "{name} {p}+{c}"
            );
        }
        let mut buf = vec![0u8; PAGE_SIZE];
        let err = store.read(&mut [
            ReadOp { page: 0, buf: &mut buf },
            ReadOp { page: N, buf: &mut vec![0u8; PAGE_SIZE] },
        ]);
        assert!(matches!(err, Err(StoreError::OutOfRange { .. })), "{name}");
        let mut all = vec![0xeeu8; N as usize * PAGE_SIZE];
        store.read(&mut [ReadOp { page: 0, buf: &mut all }]).unwrap();
        assert!(all.iter().all(|&b| b == 0), "{name}: a refused request wrote something");
    }
}

/// The child process of `ram_is_sparse` is marked by this variable.
const SPARSE_CHILD: &str = "MEMLEND_STORE_SPARSE_CHILD";

/// Resident memory is measured in a process of its own: other tests of this
/// binary run in parallel and would map and touch memory meanwhile.
#[test]
fn ram_is_sparse() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ram_sparse_in_a_quiet_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SPARSE_CHILD, "1")
        .output()
        .unwrap();
    let log =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && log.contains("1 passed"), "{log}");
    eprintln!("{}", log.lines().filter(|l| l.contains("rss")).collect::<Vec<_>>().join("\n"));
}

#[test]
#[ignore = "run by ram_is_sparse in a process of its own"]
fn ram_sparse_in_a_quiet_process() {
    if std::env::var_os(SPARSE_CHILD).is_none() {
        return;
    }
    const GIB_KIB: u64 = 1 << 20;
    let store = ram(GIB_KIB / 4);
    let (map0_kib, proc0_kib) = (mapping_rss_kib(GIB_KIB), process_rss_kib());
    for i in 0..10u64 {
        store.write(&[WriteOp { page: i * 25_000, data: &fill(i, 1) }]).unwrap();
    }
    let (map1_kib, proc1_kib) = (mapping_rss_kib(GIB_KIB), process_rss_kib());
    for i in 0..10u64 {
        store.discard(i * 25_000, 1).unwrap();
    }
    let map2_kib = mapping_rss_kib(GIB_KIB);
    println!("rss of the 1 GiB mapping: {map0_kib} KiB, 10 writes {map1_kib}, discard {map2_kib}");
    println!("rss of the process: {proc0_kib} KiB, after 10 writes {proc1_kib} KiB");
    assert!(map1_kib - map0_kib >= 40, "the writes are resident");
    assert!(map1_kib - map0_kib < 1024, "a 1 GiB store with 10 pages written holds {map1_kib} KiB");
    assert!(
        proc1_kib.saturating_sub(proc0_kib) < 1024 + 256,
        "process grew {proc0_kib} -> {proc1_kib} KiB"
    );
    assert!(map2_kib <= map0_kib, "discard frees: {map1_kib} -> {map2_kib} KiB");
}

/// Resident KiB of the one mapping of `size_kib` KiB in /proc/self/smaps.
fn mapping_rss_kib(size_kib: u64) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok()
    };
    let mut lines = smaps.lines();
    let mut found = Vec::new();
    while let Some(line) = lines.next() {
        if field(line, "Size:") == Some(size_kib) {
            found.extend(lines.by_ref().take(4).find_map(|l| field(l, "Rss:")));
        }
    }
    assert_eq!(found.len(), 1, "mappings of {size_kib} KiB");
    found[0]
}

fn process_rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let resident_pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    resident_pages * 4
}

/// What the layers cost on top of the fastest backend, in ns per 4 KiB page.
/// A measurement, not a check: run it optimised and alone,
/// `cargo test --release -p memlend-store --test model -- --ignored --nocapture overhead`.
#[test]
#[ignore = "a measurement; run with --release --ignored --nocapture"]
fn layer_overhead_ns_per_page() {
    const PAGES: u64 = 4096;
    const ROUNDS: usize = 5;
    let stores: [Box<dyn PageStore>; 5] = [
        Box::new(ram(PAGES)),
        Box::new(Stats::new(ram(PAGES))),
        Box::new(Checksum::new(ram(PAGES)).unwrap()),
        Box::new(Checksum::new(Stats::new(ram(PAGES))).unwrap()),
        Box::new(mirror(PAGES)),
    ];
    let crc_ns = best_of(ROUNDS, || {
        let page = fill(1, 1);
        time_ns_per_page(100_000, 1, |_| {
            std::hint::black_box(crc32c::crc32c(&page));
        })
    });
    println!("crc32c alone: {crc_ns:.0} ns per page");
    for batch_pages in [1u64, 16] {
        let data = filled(0, batch_pages, 1, true);
        let mut buf = Buf::new(batch_pages as usize * PAGE_SIZE, true);
        for store in &stores {
            let ops = 200_000 / batch_pages;
            let at = |i: u64| (i * 7 * batch_pages) % (PAGES - batch_pages);
            let write_ns = best_of(ROUNDS, || {
                time_ns_per_page(ops, batch_pages, |i| {
                    store.write(&[WriteOp { page: at(i), data: data.bytes() }]).unwrap()
                })
            });
            let read_ns = best_of(ROUNDS, || {
                time_ns_per_page(ops, batch_pages, |i| {
                    store.read(&mut [ReadOp { page: at(i), buf: buf.bytes_mut() }]).unwrap()
                })
            });
            let name = store.info().name;
            let per_op = format!("{batch_pages:>2} pages/op");
            println!(
                "{name:<22} {per_op}: write {write_ns:>5.0} ns/page, read {read_ns:>5.0} ns/page"
            );
        }
    }
}

fn best_of(rounds: usize, mut run: impl FnMut() -> f64) -> f64 {
    (0..rounds).map(|_| run()).fold(f64::INFINITY, f64::min)
}

fn time_ns_per_page(ops: u64, pages_per_op: u64, mut op: impl FnMut(u64)) -> f64 {
    let start = std::time::Instant::now();
    for i in 0..ops {
        op(i);
    }
    start.elapsed().as_nanos() as f64 / (ops * pages_per_op) as f64
}
