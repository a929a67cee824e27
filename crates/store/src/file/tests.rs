use super::*;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;

fn pattern(page: u64, seed: u8) -> Vec<u8> {
    (0..PAGE_SIZE).map(|i| (i as u64 ^ page.wrapping_mul(31)) as u8 ^ seed).collect()
}

fn pages_of_pattern(first: u64, count: u64, seed: u8) -> Vec<u8> {
    (first..first + count).flat_map(|p| pattern(p, seed)).collect()
}

fn read_pages(s: &FileStore, page: u64, count: u64) -> Vec<u8> {
    let mut buf = vec![0xa5; count as usize * PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
    buf
}

/// 512-byte blocks the file occupies on disk.
fn blocks(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks()
}

/// A direct store, or `None` (the test recorded as skipped) where the
/// filesystem refuses it.
fn create_direct(path: &Path, pages: u64) -> Option<FileStore> {
    match FileStore::create(path, pages, FileOptions { direct: true }) {
        Ok(s) => Some(s),
        Err(StoreError::Unavailable(why)) => {
            memlend_testskip::skip(&format!("no O_DIRECT here: {why}"));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn created_file_is_sparse_reads_zero_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = FileStore::create(&path, 1 << 18, FileOptions::default()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 30);
    assert_eq!(blocks(&path), 0);
    assert!(read_pages(&s, 77, 3).iter().all(|&b| b == 0));
    let data = pages_of_pattern(77, 3, 1);
    s.write(&[WriteOp { page: 77, data: &data }]).unwrap();
    s.flush().unwrap();
    assert_eq!(read_pages(&s, 77, 3), data);
    let info = s.info();
    assert_eq!((info.pages, info.name.as_str()), (1 << 18, "file"));
    assert!(info.caps.durable && !info.caps.fast);
}

#[test]
fn batches_coalesce_adjacent_runs_in_any_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::create(&dir.path().join("store"), 64, FileOptions::default()).unwrap();
    let (a, b, c, d) = (
        pages_of_pattern(5, 1, 2),
        pages_of_pattern(3, 2, 2),
        pages_of_pattern(0, 1, 2),
        pages_of_pattern(10, 2, 2),
    );
    let ops = [
        WriteOp { page: 5, data: &a },
        WriteOp { page: 3, data: &b },
        WriteOp { page: 0, data: &c },
        WriteOp { page: 10, data: &d },
    ];
    s.write(&ops).unwrap();
    let (mut x, mut y) = (vec![0u8; 3 * PAGE_SIZE], vec![0u8; 9 * PAGE_SIZE]);
    s.read(&mut [ReadOp { page: 3, buf: &mut y }, ReadOp { page: 0, buf: &mut x }]).unwrap();
    let mut expect = vec![0u8; 12 * PAGE_SIZE];
    for (page, data) in [(5, &a), (3, &b), (0, &c), (10, &d)] {
        expect[page * PAGE_SIZE..][..data.len()].copy_from_slice(data);
    }
    assert_eq!([x, y].concat(), expect);
}

#[test]
fn runs_longer_than_one_call_are_split() {
    let dir = tempfile::tempdir().unwrap();
    let s = FileStore::create(&dir.path().join("store"), 1024, FileOptions::default()).unwrap();
    let count = (3 * IO_BYTES_MAX / PAGE_SIZE + 5) as u64;
    let data = pages_of_pattern(7, count, 3);
    s.write(&[WriteOp { page: 7, data: &data }]).unwrap();
    assert_eq!(read_pages(&s, 7, count), data);
}

#[test]
fn discard_punches_holes_and_every_fallback_reads_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let s = FileStore::create(&path, 64, FileOptions::default()).unwrap();
    assert!(s.info().caps.discard_frees, "ext4 and tmpfs punch holes");
    let data = pages_of_pattern(0, 64, 4);
    s.write(&[WriteOp { page: 0, data: &data }]).unwrap();
    s.flush().unwrap();
    let before = blocks(&path);
    s.discard(8, 32).unwrap();
    assert!(blocks(&path) + 32 * 8 <= before, "hole punched: {} -> {}", before, blocks(&path));
    s.discard_method.store(DISCARD_WRITE_ZEROES, Ordering::Relaxed);
    s.discard(50, 3).unwrap();
    let back = read_pages(&s, 0, 64);
    for page in 0..64 {
        let got = &back[page * PAGE_SIZE..][..PAGE_SIZE];
        let zero = (8..40).contains(&page) || (50..53).contains(&page);
        let want = if zero { vec![0; PAGE_SIZE] } else { pattern(page as u64, 4) };
        assert_eq!(got, &want[..], "page {page}");
    }
}

#[test]
fn direct_io_takes_unaligned_buffers_through_a_bounce_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = create_direct(&dir.path().join("store"), 64) else { return };
    assert_eq!(s.info().name, "file-direct");
    let data = pages_of_pattern(0, 4, 5);
    let mut odd = vec![0u8; data.len() + 1];
    odd[1..].copy_from_slice(&data);
    let aligned = AlignedBuf::zeroed(PAGE_SIZE);
    // One unaligned run and one aligned run in one adjacent group.
    s.write(&[WriteOp { page: 2, data: &odd[1..] }, WriteOp { page: 6, data: aligned.bytes() }])
        .unwrap();
    let mut odd_back = vec![0u8; data.len() + 3];
    let mut aligned_back = AlignedBuf::zeroed(PAGE_SIZE);
    s.read(&mut [
        ReadOp { page: 2, buf: &mut odd_back[3..] },
        ReadOp { page: 6, buf: aligned_back.bytes_mut() },
    ])
    .unwrap();
    assert_eq!(&odd_back[3..], &data[..]);
    assert!(aligned_back.bytes().iter().all(|&b| b == 0));
    s.discard(3, 1).unwrap();
    assert!(read_pages(&s, 3, 1).iter().all(|&b| b == 0));
}

#[test]
fn open_checks_the_size_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    FileStore::create(&path, 10, FileOptions::default()).unwrap();
    let page = PAGE_SIZE as u64;
    let opts = FileOptions::default();
    assert_eq!(FileStore::open(&path, None, opts).unwrap().info().pages, 10);
    assert_eq!(FileStore::open(&path, Some(4 * page), opts).unwrap().info().pages, 4);
    assert!(matches!(
        FileStore::open(&path, Some(page + 1), opts),
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(FileStore::open(&path, Some(0), opts), Err(StoreError::Unavailable(_))));
    assert!(matches!(FileStore::open(&path, Some(11 * page), opts), Err(StoreError::NoSpace(_))));
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(2 * page + 100).unwrap();
    assert!(matches!(FileStore::open(&path, None, opts), Err(StoreError::Unavailable(_))));
    assert!(FileStore::open(&dir.path().join("missing"), None, opts).is_err());
    assert!(FileStore::open(dir.path(), None, opts).is_err());
    assert!(FileStore::create(Path::new("/dev/null"), 1, opts).is_err());
    assert!(matches!(FileStore::create(&path, 0, opts), Err(StoreError::NoSpace(_))));
    assert!(matches!(FileStore::create(&path, u64::MAX / 2, opts), Err(StoreError::NoSpace(_))));
}

#[test]
fn existing_contents_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let data = pages_of_pattern(2, 2, 6);
    {
        let s = FileStore::create(&path, 8, FileOptions::default()).unwrap();
        s.write(&[WriteOp { page: 2, data: &data }]).unwrap();
        s.flush().unwrap();
    }
    let s = FileStore::open(&path, None, FileOptions::default()).unwrap();
    assert_eq!(read_pages(&s, 2, 2), data);
}

#[test]
fn refused_o_direct_says_so() {
    let err = open_error(
        Path::new("/x"),
        FileOptions { direct: true },
        std::io::Error::from_raw_os_error(libc::EINVAL),
    );
    assert!(matches!(&err, StoreError::Unavailable(why) if why.contains("O_DIRECT")), "{err}");
}

/// A loop device over a file, detached on drop.
struct LoopDevice {
    dev: PathBuf,
}

impl LoopDevice {
    /// `None` where loop devices cannot be made here (not root, no driver).
    fn attach(backing: &Path) -> Option<LoopDevice> {
        let out = Command::new("losetup").arg("--find").arg("--show").arg(backing).output().ok()?;
        let dev = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !dev.is_empty()).then(|| LoopDevice { dev: dev.into() })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

#[test]
fn block_device_size_io_and_every_discard_way() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let page = PAGE_SIZE as u64;
    File::create(&backing).unwrap().set_len(64 * page).unwrap();
    let Some(lo) = LoopDevice::attach(&backing) else {
        memlend_testskip::skip("cannot attach a loop device here");
        return;
    };
    let opts = FileOptions::default();
    assert!(matches!(FileStore::open(&lo.dev, Some(65 * page), opts), Err(StoreError::NoSpace(_))));
    assert!(matches!(
        FileStore::open(&lo.dev, Some(page + 512), opts),
        Err(StoreError::Unavailable(_))
    ));
    for direct in [false, true] {
        let s = FileStore::open(&lo.dev, None, FileOptions { direct }).unwrap();
        assert_eq!(s.info().pages, 64);
        let data = pages_of_pattern(0, 64, 7);
        for method in [DISCARD_PUNCH, DISCARD_ZERO_OUT, DISCARD_WRITE_ZEROES] {
            s.write(&[WriteOp { page: 0, data: &data }]).unwrap();
            s.discard_method.store(method, Ordering::Relaxed);
            s.discard(10, 20).unwrap();
            let back = read_pages(&s, 0, 64);
            assert_eq!(&back[..10 * PAGE_SIZE], &data[..10 * PAGE_SIZE], "method {method}");
            assert!(
                back[10 * PAGE_SIZE..30 * PAGE_SIZE].iter().all(|&b| b == 0),
                "method {method}"
            );
            assert_eq!(&back[30 * PAGE_SIZE..], &data[30 * PAGE_SIZE..], "method {method}");
        }
        s.flush().unwrap();
    }
}

#[test]
fn direct_alignment_is_learned_per_filesystem() {
    for parent in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
        let Ok(dir) = tempfile::tempdir_in(&parent) else { continue };
        let Some(s) = create_direct(&dir.path().join("store"), 4) else { continue };
        eprintln!("{}: O_DIRECT memory alignment {} bytes", parent.display(), s.mem_align_bytes);
        assert!(s.mem_align_bytes.is_power_of_two() && s.mem_align_bytes <= PAGE_SIZE);
    }
    let dir = tempfile::tempdir().unwrap();
    let buffered = FileStore::create(&dir.path().join("store"), 4, FileOptions::default()).unwrap();
    assert_eq!(buffered.mem_align_bytes, 1);
}

/// A batch of more scattered runs than one io_uring submission holds, some
/// through the bounce buffer, goes down and comes back byte for byte.
#[test]
fn scattered_batches_larger_than_one_submission_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = create_direct(&dir.path().join("store"), 512) else { return };
    let runs = GROUPS_PER_BATCH_MAX as u64 * 2 + 5;
    let pages: Vec<u64> = (0..runs).map(|i| (i * 37) % 500).collect();
    let data: Vec<Vec<u8>> = pages.iter().map(|&p| pages_of_pattern(p, 1, 9)).collect();
    let mut unaligned = vec![0u8; PAGE_SIZE + 1];
    unaligned[1..].copy_from_slice(&data[0]);
    let mut ops: Vec<WriteOp<'_>> = vec![WriteOp { page: pages[0], data: &unaligned[1..] }];
    ops.extend(pages.iter().zip(&data).skip(1).map(|(&page, d)| WriteOp { page, data: d }));
    s.write(&ops).unwrap();
    let mut back: Vec<Vec<u8>> = pages.iter().map(|_| vec![0u8; PAGE_SIZE + 1]).collect();
    let mut reads: Vec<ReadOp<'_>> = pages
        .iter()
        .zip(back.iter_mut())
        .map(|(&page, b)| ReadOp { page, buf: &mut b[1..] })
        .collect();
    s.read(&mut reads).unwrap();
    for (i, (b, d)) in back.iter().zip(&data).enumerate() {
        assert_eq!(&b[1..], &d[..], "run {i} at page {}", pages[i]);
    }
}
