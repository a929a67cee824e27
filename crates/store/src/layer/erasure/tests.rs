use super::*;
use crate::layer::flaky::Flaky;
use crate::layer::mirror::SpareFn;
use std::sync::atomic::Ordering::SeqCst;

/// Logical pages of the tests: stripes of 4 over 4+2, the last one short.
const PAGES: u64 = 203;

fn legs(k: usize, m: usize) -> (Vec<Arc<Flaky>>, Erasure) {
    let per_leg = PAGES.div_ceil(k as u64);
    let f: Vec<Arc<Flaky>> = (0..k + m).map(|_| Flaky::new(per_leg)).collect();
    let named = |r: std::ops::Range<usize>| -> Vec<(Arc<dyn PageStore>, String)> {
        r.map(|i| (Arc::clone(&f[i]) as Arc<dyn PageStore>, format!("leg{i}"))).collect()
    };
    let e = Erasure::new(named(0..k), named(k..k + m), PAGES, None).unwrap();
    (f, e)
}

fn page_of(page: u64, version: u8) -> Vec<u8> {
    let mut v = vec![version; PAGE_SIZE];
    v[..8].copy_from_slice(&page.to_le_bytes());
    v
}

fn write_some(e: &Erasure, version: u8) {
    // Single pages, then a long run that crosses stripes.
    for page in (0..PAGES).step_by(5) {
        e.write(&[WriteOp { page, data: &page_of(page, version) }]).unwrap();
    }
    let run: Vec<u8> = (40..77).flat_map(|p| page_of(p, version)).collect();
    e.write(&[WriteOp { page: 40, data: &run }]).unwrap();
}

fn expected(page: u64, version: u8) -> Vec<u8> {
    match page.is_multiple_of(5) || (40..77).contains(&page) {
        true => page_of(page, version),
        false => vec![0; PAGE_SIZE],
    }
}

fn check_all(e: &Erasure, version: u8) {
    let mut buf = vec![0u8; PAGES as usize * PAGE_SIZE];
    e.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
    for (p, got) in buf.chunks_exact(PAGE_SIZE).enumerate() {
        assert!(got == expected(p as u64, version), "page {p}");
    }
    for page in [0, 3, 4, 41, 202] {
        let mut one = vec![0u8; PAGE_SIZE];
        e.read(&mut [ReadOp { page, buf: &mut one }]).unwrap();
        assert!(one == expected(page, version), "single page {page}");
    }
}

#[test]
fn pages_round_trip_and_parity_costs_m_over_k() {
    let (f, e) = legs(4, 2);
    assert!(e.info().name.starts_with("erasure4+2("));
    write_some(&e, 1);
    check_all(&e, 1);
    // 1.5x the pages, where a mirror takes 2x.
    let held: u64 = f.iter().map(|l| l.info().pages).sum();
    assert_eq!(held, PAGES.div_ceil(4) * 6);
    e.discard(40, 37).unwrap();
    let mut one = vec![1u8; PAGE_SIZE];
    e.read(&mut [ReadOp { page: 41, buf: &mut one }]).unwrap();
    assert!(one.iter().all(|&b| b == 0));
}

#[test]
fn any_m_legs_may_die_and_nothing_is_lost() {
    for dead in [[0, 1], [0, 4], [3, 5], [4, 5]] {
        let (f, e) = legs(4, 2);
        write_some(&e, 1);
        for d in dead {
            f[d].dead.store(true, SeqCst);
        }
        check_all(&e, 1);
        // Writes go on, degraded, and read back.
        write_some(&e, 2);
        check_all(&e, 2);
        assert_eq!(e.stats().healthy_legs, 4, "dead {dead:?}");
        assert!(e.stats().degraded_reads > 0 || dead[0] >= 4);
    }
}

/// A third leg failing with two already gone is kept, not dropped: it may
/// only be slow. Operations that need it fail clearly, nothing is counted
/// lost, and once it answers again every page reads back and writes go on.
#[test]
fn one_leg_too_many_fails_clearly_and_loses_nothing_once_it_answers() {
    let (f, e) = legs(4, 2);
    write_some(&e, 1);
    for d in [0, 1, 2] {
        f[d].dead.store(true, SeqCst);
    }
    let mut buf = vec![0u8; PAGE_SIZE];
    // Page 0 is on a dead leg and only 3 shards of its stripe answer.
    let err = e.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap_err().to_string();
    assert!(err.contains("try again"), "{err}");
    let err = e.write(&[WriteOp { page: 3, data: &page_of(3, 9) }]).unwrap_err().to_string();
    assert!(err.contains("try again"), "{err}");
    let s = e.stats();
    assert_eq!((s.healthy_legs, s.lost_pages), (4, 0), "{s:?}");
    assert!(s.kept_leg_errors > 0, "{s:?}");
    f[2].dead.store(false, SeqCst);
    check_all(&e, 1);
    write_some(&e, 2);
    check_all(&e, 2);
    let s = e.stats();
    assert_eq!((s.healthy_legs, s.leg_failures, s.lost_pages), (4, 2, 0), "{s:?}");
}

/// A batch of whole stripes costs one write a leg and no reads; one that
/// starts and ends mid-stripe reads the edges' other pages, one request a
/// leg.
#[test]
fn a_batch_is_one_request_a_leg() {
    let (f, e) = legs(4, 2);
    let count = |f: &[Arc<Flaky>]| -> (u64, u64) {
        let reads = f.iter().map(|l| l.reads.swap(0, SeqCst)).sum();
        (reads, f.iter().map(|l| l.writes.swap(0, SeqCst)).sum())
    };
    let run: Vec<u8> = (0..200).flat_map(|p| page_of(p, 1)).collect();
    e.write(&[WriteOp { page: 0, data: &run }]).unwrap();
    assert_eq!(count(&f), (0, 6), "50 whole stripes: a write a leg");
    // Pages 2..198: stripes 0 and 49 need pages 0, 1, 198 and 199.
    let run: Vec<u8> = (2..198).flat_map(|p| page_of(p, 2)).collect();
    e.write(&[WriteOp { page: 2, data: &run }]).unwrap();
    assert_eq!(count(&f), (4, 6), "edges read once a leg");
    let mut buf = vec![0u8; 200 * PAGE_SIZE];
    e.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
    for (p, got) in buf.chunks_exact(PAGE_SIZE).enumerate() {
        let v = if (2..198).contains(&p) { 2 } else { 1 };
        assert!(got == page_of(p as u64, v), "page {p}");
    }
}

/// A page that lies while a batch reads it to complete its stripe is
/// decoded, so the parity written is right: with that leg and another
/// gone, every page still decodes.
#[test]
fn a_lying_page_under_a_batch_is_decoded_before_the_parity_is_made() {
    let (f, e) = legs(4, 2);
    write_some(&e, 1);
    // Page 45 (leg 1, leg page 11) completes stripe 11 of a batch that
    // writes pages 46..60.
    f[1].lie_about.store(11 + 1, SeqCst);
    let run: Vec<u8> = (46..60).flat_map(|p| page_of(p, 1)).collect();
    e.write(&[WriteOp { page: 46, data: &run }]).unwrap();
    assert_eq!(e.stats().bad_copies, 1);
    f[1].lie_about.store(0, SeqCst);
    f[1].dead.store(true, SeqCst);
    f[2].dead.store(true, SeqCst);
    check_all(&e, 1);
    assert_eq!(e.stats().lost_pages, 0);
}

/// A leg that dies under a batch is dropped; the batch succeeds on the
/// others and reads back.
#[test]
fn a_leg_that_dies_under_a_batch_costs_nothing() {
    let (f, e) = legs(4, 2);
    write_some(&e, 1);
    f[5].dead.store(true, SeqCst);
    f[2].dead.store(true, SeqCst);
    write_some(&e, 2);
    check_all(&e, 2);
    let s = e.stats();
    assert_eq!((s.leg_failures, s.lost_pages), (2, 0), "{s:?}");
}

#[test]
fn a_lying_leg_is_caught_and_the_page_decoded() {
    let (f, e) = legs(4, 2);
    write_some(&e, 1);
    // Page 45 is on leg 1 at leg page 11.
    f[1].lie_about.store(11 + 1, SeqCst);
    let mut buf = vec![0u8; PAGE_SIZE];
    e.read(&mut [ReadOp { page: 45, buf: &mut buf }]).unwrap();
    assert!(buf == page_of(45, 1));
    let st = e.stats();
    assert_eq!((st.bad_copies, st.degraded_reads, st.lost_pages), (1, 1, 0));
}

/// Encrypted shards (donor slabs under `crypt`): a tampered shard is
/// caught by its own leg, decoded from the others, and the leg stays in.
#[test]
fn a_shard_its_own_leg_finds_corrupt_is_decoded_and_the_leg_kept() {
    use crate::layer::{Crypt, LocalTags};
    use crate::ram::{RamOptions, RamStore};
    let per_leg = PAGES.div_ceil(4);
    let legs: Vec<_> = (0..6u8)
        .map(|i| {
            let ram = RamStore::new(per_leg, RamOptions::default()).unwrap();
            Arc::new(Crypt::new(LocalTags::new(ram).unwrap(), [i + 1; 32]).unwrap())
        })
        .collect();
    let named = |r: std::ops::Range<usize>| -> Vec<(Arc<dyn PageStore>, String)> {
        r.map(|i| (Arc::clone(&legs[i]) as Arc<dyn PageStore>, format!("leg{i}"))).collect()
    };
    let e = Erasure::new(named(0..4), named(4..6), PAGES, None).unwrap();
    write_some(&e, 1);
    // Page 45 is on leg 1 at leg page 11: flip a byte of its ciphertext.
    let raw = legs[1].inner().inner();
    let mut sealed = vec![0u8; PAGE_SIZE];
    raw.read(&mut [ReadOp { page: 11, buf: &mut sealed }]).unwrap();
    sealed[5] ^= 1;
    raw.write(&[WriteOp { page: 11, data: &sealed }]).unwrap();
    let mut buf = vec![0u8; 8 * PAGE_SIZE];
    e.read(&mut [ReadOp { page: 41, buf: &mut buf }]).unwrap();
    let want: Vec<u8> = (41..49).flat_map(|p| expected(p, 1)).collect();
    assert!(buf == want);
    let st = e.stats();
    assert_eq!((st.leg_failures, st.healthy_legs, st.lost_pages), (0, 6, 0));
    assert!(st.bad_copies >= 1 && st.degraded_reads == 1, "{st:?}");
    check_all(&e, 1);
}

#[test]
fn concurrent_writers_of_one_stripe_keep_it_decodable() {
    let (f, e) = legs(4, 2);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let e = &e;
            s.spawn(move || {
                for i in 0..200u64 {
                    let page = t + 4 * (i % 3);
                    e.write(&[WriteOp { page, data: &page_of(page, i as u8) }]).unwrap();
                }
            });
        }
    });
    // Every data leg dies in turn: each page must decode to what a plain
    // read gives.
    let mut want = vec![0u8; 12 * PAGE_SIZE];
    e.read(&mut [ReadOp { page: 0, buf: &mut want }]).unwrap();
    for (d, leg) in f.iter().enumerate().take(4) {
        leg.dead.store(true, SeqCst);
        let mut got = vec![0u8; 12 * PAGE_SIZE];
        e.read(&mut [ReadOp { page: 0, buf: &mut got }]).unwrap();
        assert!(got == want, "with leg {d} dead");
        leg.dead.store(false, SeqCst);
        e.inner.legs[d].state.store(HEALTHY, SeqCst);
    }
}

#[test]
fn bad_arguments_are_refused() {
    let one = |pages| (Flaky::new(pages) as Arc<dyn PageStore>, "x".to_string());
    assert!(Erasure::new(vec![], vec![one(10)], 10, None).is_err());
    assert!(Erasure::new(vec![one(10)], vec![], 10, None).is_err());
    assert!(Erasure::new(vec![one(2), one(2)], vec![one(2)], 10, None).is_err(), "legs too small");
    let (_f, e) = legs(4, 2);
    let mut buf = vec![0u8; PAGE_SIZE];
    assert!(matches!(
        e.read(&mut [ReadOp { page: PAGES, buf: &mut buf }]),
        Err(StoreError::OutOfRange { .. })
    ));
}

/// A data leg and then a parity leg die; each is rebuilt on a spare while
/// writes go on, after which two *other* legs may die and nothing is lost.
#[test]
fn lost_legs_are_rebuilt_on_spares() {
    for lost in [1usize, 5] {
        let per_leg = PAGES.div_ceil(4);
        let f: Vec<Arc<Flaky>> = (0..6).map(|_| Flaky::new(per_leg)).collect();
        let named = |r: std::ops::Range<usize>| -> Vec<(Arc<dyn PageStore>, String)> {
            r.map(|i| (Arc::clone(&f[i]) as Arc<dyn PageStore>, format!("leg{i}"))).collect()
        };
        let made = Arc::new(parking_lot::Mutex::new(0));
        let made2 = Arc::clone(&made);
        let spare: SpareFn = Box::new(move |req| {
            let mut n = made2.lock();
            *n += 1;
            let label = format!("spare{n}");
            assert!(!req.avoid.contains(&label) && req.avoid.contains(&"leg1".to_string()));
            Ok((Flaky::new(req.pages) as Arc<dyn PageStore>, label))
        });
        let e = Erasure::new(named(0..4), named(4..6), PAGES, Some(spare)).unwrap();
        write_some(&e, 1);
        f[lost].dead.store(true, SeqCst);
        check_all(&e, 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while e.stats().rebuilds == 0 {
            write_some(&e, 2);
            assert!(std::time::Instant::now() < deadline, "no rebuild of leg {lost}");
        }
        write_some(&e, 3);
        let survivors = [0, 2, 3, 4].iter().filter(|&&d| d != lost).take(2);
        for &d in survivors {
            f[d].dead.store(true, SeqCst);
        }
        check_all(&e, 3);
        assert_eq!(e.stats().lost_pages, 0);
    }
}

/// A source leg that lies about one page while a lost leg is rebuilt: the
/// batch finds the bad page by its sum and that stripe is rebuilt on its
/// own from the other shards, so the spare holds the right shard: with two
/// more legs gone afterwards, every page still reads back.
#[test]
fn a_lying_source_does_not_poison_the_rebuild() {
    let per_leg = PAGES.div_ceil(4);
    let f: Vec<Arc<Flaky>> = (0..6).map(|_| Flaky::new(per_leg)).collect();
    let named = |r: std::ops::Range<usize>| -> Vec<(Arc<dyn PageStore>, String)> {
        r.map(|i| (Arc::clone(&f[i]) as Arc<dyn PageStore>, format!("leg{i}"))).collect()
    };
    // One spare only: the legs killed after the rebuild stay unreadable.
    let once = parking_lot::Mutex::new(Some(Flaky::new(per_leg)));
    let spare: SpareFn = Box::new(move |_| match once.lock().take() {
        Some(s) => Ok((s as Arc<dyn PageStore>, "spare".into())),
        None => Err(StoreError::NoSpace("no more spares".into())),
    });
    let e = Erasure::new(named(0..4), named(4..6), PAGES, Some(spare)).unwrap();
    write_some(&e, 1);
    // Page 40 is data leg 0's page of stripe 10, beside page 41 on leg 1.
    f[0].lie_about.store(10 + 1, SeqCst);
    f[1].dead.store(true, SeqCst);
    let _ = e.read(&mut [ReadOp { page: 41, buf: &mut vec![0u8; PAGE_SIZE] }]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while e.stats().rebuilds == 0 {
        assert!(std::time::Instant::now() < deadline, "no rebuild");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = e.stats();
    assert!(st.bad_copies >= 1, "the lie was seen: {st:?}");
    assert!(st.pages_rebuilt > 0, "{st:?}");
    f[0].lie_about.store(0, SeqCst);
    f[2].dead.store(true, SeqCst);
    f[4].dead.store(true, SeqCst);
    check_all(&e, 1);
    assert_eq!(e.stats().lost_pages, 0);
}

/// An error from a store the slot no longer holds (a read sent to a dead
/// donor that fails after a spare took its slot) does not drop the spare;
/// the same error from the slot's own store does.
#[test]
fn an_error_from_a_replaced_store_does_not_drop_its_spare() {
    let (_f, e) = legs(4, 2);
    let c = &e.inner;
    let old = c.legs[0].store();
    let spare: Arc<dyn PageStore> = Flaky::new(PAGES.div_ceil(4));
    *c.legs[0].store.write() = Arc::clone(&spare);
    let err = StoreError::Unavailable("connection reset".into());
    assert!(c.leg_failed(0, &old, &err, "read"), "the operation's shard is still unusable");
    assert!(c.legs[0].readable(), "the spare in the slot is kept");
    assert_eq!(e.stats().leg_failures, 0);
    assert!(c.leg_failed(0, &spare, &err, "read"));
    assert!(!c.legs[0].readable(), "an error from the slot's own store drops it");
    assert_eq!(e.stats().leg_failures, 1);
}
