use super::*;
use crate::layer::flaky::Flaky;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

const PAGES: u64 = 512;

fn page_of(page: u64, version: u8) -> Vec<u8> {
    let mut v = vec![version; PAGE_SIZE];
    v[..8].copy_from_slice(&page.to_le_bytes());
    v
}

fn legs(flaky: &[Arc<Flaky>]) -> Vec<(Arc<dyn PageStore>, String)> {
    flaky
        .iter()
        .enumerate()
        .map(|(i, f)| (Arc::clone(f) as Arc<dyn PageStore>, format!("d{i}")))
        .collect()
}

/// Spares named s0, s1, ... handed out in order; their count is returned.
fn spares(made: Arc<Mutex<Vec<Arc<Flaky>>>>) -> SpareFn {
    Box::new(move |req| {
        let mut made = made.lock();
        let f = Flaky::new(req.pages);
        let label = format!("s{}", made.len());
        assert!(!req.avoid.contains(&label));
        made.push(Arc::clone(&f));
        Ok((f as Arc<dyn PageStore>, label))
    })
}

fn read_page(m: &Mirror, page: u64) -> StoreResult<Vec<u8>> {
    let mut buf = vec![0u8; PAGE_SIZE];
    m.read(&mut [ReadOp { page, buf: &mut buf }])?;
    Ok(buf)
}

fn write_all(m: &Mirror, version: u8) {
    for page in (0..PAGES).step_by(3) {
        m.write(&[WriteOp { page, data: &page_of(page, version) }]).unwrap();
    }
}

fn check_all(m: &Mirror, version: u8) {
    for page in 0..PAGES {
        let want = if page % 3 == 0 { page_of(page, version) } else { vec![0; PAGE_SIZE] };
        assert_eq!(read_page(m, page).unwrap(), want, "page {page}");
    }
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn writes_reach_every_leg_and_reads_verify() {
    let f = [Flaky::new(PAGES), Flaky::new(PAGES)];
    let m = Mirror::new(legs(&f), PAGES, MirrorOptions::default(), None).unwrap();
    assert_eq!(m.info().name, "mirror(flaky, flaky)");
    write_all(&m, 1);
    check_all(&m, 1);
    for leg in &f {
        let mut buf = vec![0u8; PAGE_SIZE];
        leg.read(&mut [ReadOp { page: 3, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page_of(3, 1));
    }
    m.discard(0, 4).unwrap();
    assert_eq!(read_page(&m, 3).unwrap(), vec![0; PAGE_SIZE]);
    assert_eq!(m.stats().leg_failures, 0);
}

#[test]
fn a_dead_leg_is_dropped_and_nothing_is_lost() {
    let f = [Flaky::new(PAGES), Flaky::new(PAGES)];
    let m = Mirror::new(legs(&f), PAGES, MirrorOptions::default(), None).unwrap();
    write_all(&m, 1);
    f[0].dead.store(true, SeqCst);
    check_all(&m, 1);
    write_all(&m, 2);
    check_all(&m, 2);
    let st = m.stats();
    assert_eq!((st.leg_failures, st.healthy_legs), (1, 1));
    assert_eq!(m.legs()[0], ("d0".to_string(), "failed"));
    // The last copy failing makes operations fail, with a clear error, but
    // it is kept: it may only be slow, and it holds every page.
    f[1].dead.store(true, SeqCst);
    let err = read_page(&m, 3).unwrap_err().to_string();
    assert!(err.contains("no copy of page 3"), "{err}");
    assert!(m.write(&[WriteOp { page: 0, data: &page_of(0, 3) }]).is_err());
    let st = m.stats();
    assert_eq!((st.leg_failures, st.healthy_legs, st.last_leg_errors), (1, 1, 2));
    f[1].dead.store(false, SeqCst);
    check_all(&m, 2);
}

#[test]
fn a_bad_copy_is_counted_read_elsewhere_and_repaired() {
    let f = [Flaky::new(PAGES), Flaky::new(PAGES)];
    let m = Mirror::new(legs(&f), PAGES, MirrorOptions::default(), None).unwrap();
    write_all(&m, 1);
    f[0].lie_about.store(9 + 1, SeqCst);
    assert_eq!(read_page(&m, 9).unwrap(), page_of(9, 1));
    f[0].lie_about.store(0, SeqCst);
    let st = m.stats();
    assert_eq!((st.bad_copies, st.repaired_pages, st.leg_failures, st.lost_pages), (1, 1, 0, 0));
    // Both legs lying: the read fails as corrupt, and the page counts lost.
    f[0].lie_about.store(12 + 1, SeqCst);
    f[1].lie_about.store(12 + 1, SeqCst);
    let err = read_page(&m, 12).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { page: 12, .. }), "{err}");
    assert_eq!(m.stats().lost_pages, 1);
}

/// Legs that authenticate their own pages (encrypted donor slabs): a
/// tampered page is caught by its leg, read from the other and rewritten,
/// and the rest of the batch is still served from the first leg.
#[test]
fn a_copy_its_own_leg_finds_corrupt_is_repaired_from_the_other() {
    use crate::layer::{Crypt, LocalTags};
    use crate::ram::{RamOptions, RamStore};
    let leg = |key| {
        let ram = RamStore::new(PAGES, RamOptions::default()).unwrap();
        Arc::new(Crypt::new(LocalTags::new(ram).unwrap(), [key; 32]).unwrap())
    };
    let (a, b) = (leg(1), leg(2));
    let named = vec![
        (Arc::clone(&a) as Arc<dyn PageStore>, "a".to_string()),
        (Arc::clone(&b) as Arc<dyn PageStore>, "b".to_string()),
    ];
    let m = Mirror::new(named, PAGES, MirrorOptions::default(), None).unwrap();
    let data: Vec<u8> = (0..4).flat_map(|p| page_of(p, 1)).collect();
    m.write(&[WriteOp { page: 0, data: &data }]).unwrap();
    // Flip a byte of page 2's ciphertext on leg a, under its tag.
    let raw = a.inner().inner();
    let mut sealed = vec![0u8; PAGE_SIZE];
    raw.read(&mut [ReadOp { page: 2, buf: &mut sealed }]).unwrap();
    sealed[77] ^= 1;
    raw.write(&[WriteOp { page: 2, data: &sealed }]).unwrap();
    let mut buf = vec![0u8; 4 * PAGE_SIZE];
    m.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
    assert_eq!(buf, data);
    let st = m.stats();
    assert_eq!((st.bad_copies, st.repaired_pages, st.leg_failures, st.lost_pages), (1, 1, 0, 0));
    // Leg a holds a good copy again.
    let mut again = vec![0u8; PAGE_SIZE];
    a.read(&mut [ReadOp { page: 2, buf: &mut again }]).unwrap();
    assert_eq!(again, page_of(2, 1));
    assert_eq!(a.corrupt_pages(), 2, "the batch read and the single-page re-check");
    // Legs that check their own pages: no sums here, only the written bits.
    assert_eq!(m.metadata_bytes(), PAGES.div_ceil(64) as usize * 8);
}

/// Legs that check their own pages (encrypted) and a spare that does not:
/// the spare gets a checksum, so once it is the only copy a page it lies
/// about fails clearly instead of reading back wrong.
#[test]
fn a_spare_that_checks_nothing_gets_a_checksum() {
    use crate::layer::{Crypt, LocalTags};
    let f = [Flaky::new(PAGES), Flaky::new(PAGES)];
    let sealed = |i: usize| {
        let store = Crypt::new(LocalTags::new(Arc::clone(&f[i])).unwrap(), [i as u8; 32]).unwrap();
        (Arc::new(store) as Arc<dyn PageStore>, format!("d{i}"))
    };
    let made = Arc::new(Mutex::new(Vec::new()));
    // One spare only: once d0 dies too, the spare must stay the only copy.
    let (one, count) = (spares(made.clone()), made.clone());
    let once: SpareFn = Box::new(move |req| {
        let made = count.lock().len();
        match made {
            0 => one(req),
            _ => Err(StoreError::NoSpace("one spare only".into())),
        }
    });
    let opts = MirrorOptions { spread_reads: false, spare_retry: Duration::from_millis(10) };
    let m = Mirror::new(vec![sealed(0), sealed(1)], PAGES, opts, Some(once)).unwrap();
    assert_eq!(m.metadata_bytes(), PAGES.div_ceil(64) as usize * 8, "no sums");
    write_all(&m, 1);
    f[1].dead.store(true, SeqCst);
    write_all(&m, 2);
    wait_for("the rebuild", || m.stats().rebuilds == 1);
    assert!(m.info().name.contains("checksum(flaky)"), "{}", m.info().name);
    f[0].dead.store(true, SeqCst);
    check_all(&m, 2);
    made.lock()[0].lie_about.store(6 + 1, SeqCst);
    let r = read_page(&m, 6).map(|_| "the page");
    assert!(matches!(r, Err(StoreError::Corrupt { page: 6, .. })), "{r:?}");
    assert_eq!(read_page(&m, 9).unwrap(), page_of(9, 2));
    assert_eq!(m.stats().lost_pages, 1);
}

#[test]
fn a_spare_is_filled_while_writes_go_on() {
    let f = [Flaky::new(PAGES), Flaky::new(PAGES)];
    let made = Arc::new(Mutex::new(Vec::new()));
    let opts = MirrorOptions { spread_reads: true, spare_retry: Duration::from_millis(10) };
    let m = Mirror::new(legs(&f), PAGES, opts, Some(spares(Arc::clone(&made)))).unwrap();
    write_all(&m, 1);
    f[1].dead.store(true, SeqCst);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..20 {
                write_all(&m, 2);
            }
        });
        wait_for("the rebuild", || m.stats().rebuilds == 1);
    });
    write_all(&m, 3);
    check_all(&m, 3);
    let st = m.stats();
    assert_eq!((st.healthy_legs, st.leg_failures, st.lost_pages), (2, 1, 0));
    assert!(st.pages_rebuilt >= PAGES / 3, "{st:?}");
    assert_eq!(m.legs()[1], ("s0".to_string(), "healthy"));
    // Now the original leg dies too: the spare alone has every page.
    f[0].dead.store(true, SeqCst);
    check_all(&m, 3);
    assert!(made.lock()[0].reads.load(SeqCst) > 0);
}

#[test]
fn no_spare_keeps_retrying_and_the_mirror_stays_usable() {
    let f = [Flaky::new(PAGES), Flaky::new(PAGES)];
    let asked = Arc::new(AtomicU64::new(0));
    let asked2 = Arc::clone(&asked);
    let spare: SpareFn = Box::new(move |_| {
        asked2.fetch_add(1, SeqCst);
        Err(StoreError::NoSpace("no donor has room".into()))
    });
    let opts = MirrorOptions { spread_reads: false, spare_retry: Duration::from_millis(5) };
    let m = Mirror::new(legs(&f), PAGES, opts, Some(spare)).unwrap();
    write_all(&m, 1);
    f[0].dead.store(true, SeqCst);
    check_all(&m, 1);
    wait_for("three attempts", || asked.load(SeqCst) >= 3);
    write_all(&m, 2);
    check_all(&m, 2);
    drop(m); // joins the rebuilder promptly
}

#[test]
fn bad_arguments_are_refused() {
    let f = [Flaky::new(PAGES), Flaky::new(PAGES / 2)];
    assert!(Mirror::new(legs(&f[..1]), PAGES, MirrorOptions::default(), None).is_err());
    assert!(Mirror::new(legs(&f), PAGES, MirrorOptions::default(), None).is_err());
    let m = Mirror::new(legs(&f), PAGES / 2, MirrorOptions::default(), None).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    let err = m.read(&mut [ReadOp { page: PAGES / 2, buf: &mut buf }]).unwrap_err();
    assert!(matches!(err, StoreError::OutOfRange { .. }));
    assert_eq!(m.stats().leg_failures, 0, "a caller's error is not a leg's");
}

#[test]
fn concurrent_writers_keep_the_legs_identical() {
    let f = [Flaky::new(64), Flaky::new(64)];
    let m = Mirror::new(legs(&f), 64, MirrorOptions::default(), None).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let m = &m;
            s.spawn(move || {
                for i in 0..300u64 {
                    let page = (i * 7 + t as u64) % 64;
                    m.write(&[WriteOp { page, data: &page_of(page, t + 1) }]).unwrap();
                }
            });
        }
    });
    for page in 0..64 {
        let (mut a, mut b) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
        f[0].read(&mut [ReadOp { page, buf: &mut a }]).unwrap();
        f[1].read(&mut [ReadOp { page, buf: &mut b }]).unwrap();
        assert_eq!(a, b, "legs differ at page {page}");
    }
}
