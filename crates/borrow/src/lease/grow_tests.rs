use super::*;
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{ReadOp, StoreError, WriteOp};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::mpsc::Receiver;

const MIB_PAGES: u64 = (1 << 20) / PAGE_SIZE as u64;

#[test]
fn segments_start_small_double_and_cover_the_region_exactly() {
    let first = 256 * MIB_PAGES;
    let sizes = layout(16 << 18, first);
    assert_eq!(sizes.iter().sum::<u64>(), 16 << 18, "16 GiB in pages");
    assert_eq!(&sizes[..4], &[first, first, 2 * first, 4 * first]);
    assert!(sizes.iter().all(|&s| s <= SEGMENT_BYTES_MAX / PAGE_SIZE as u64));
    assert_eq!(sizes.len(), 4 + 7, "2 GiB in four, then 2 GiB each: {sizes:?}");
    assert_eq!(layout(100, first), vec![100], "a small region is one lease");
    assert_eq!(layout(5, 2), vec![2, 2, 1]);
}

/// A stand-in for the lease thread: answers every ask with a RAM store,
/// or refuses while `refuse` is set; counts the asks, and the asks for
/// other segments than 3 in its high 32 bits.
fn lease_thread(events: Receiver<Event>, asks: Arc<AtomicU64>, refuse: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        for e in events {
            let Event::Grow(g) = e else { continue };
            asks.fetch_add(if g.segment == 3 { 1 } else { 1 << 32 }, SeqCst);
            let answer = match refuse.load(SeqCst) {
                0 => Ok(Arc::new(RamStore::new(g.pages, RamOptions::default()).unwrap())
                    as Arc<dyn PageStore>),
                _ => Err("no room".to_string()),
            };
            let _ = g.reply.send(answer);
        }
    });
}

fn lazy(pages: u64) -> (OnDemand, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (tx, rx) = crate::lease::channel();
    let (asks, refuse) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    lease_thread(rx, Arc::clone(&asks), Arc::clone(&refuse));
    let like = RamStore::new(1, RamOptions::default()).unwrap().info();
    (unleased_segment(3, pages, like, tx), asks, refuse)
}

fn page(seed: u8) -> Vec<u8> {
    vec![seed; PAGE_SIZE]
}

#[test]
fn an_unwritten_segment_reads_zeros_and_asks_for_nothing() {
    let (l, asks, _) = lazy(64);
    let mut buf = page(7);
    l.read(&mut [ReadOp { page: 5, buf: &mut buf }]).unwrap();
    assert_eq!(buf, page(0));
    l.discard(0, 64).unwrap();
    l.flush().unwrap();
    assert!(l.read(&mut [ReadOp { page: 64, buf: &mut buf }]).is_err(), "out of range");
    assert_eq!(l.info().pages, 64);
    assert_eq!(asks.load(SeqCst), 0);
}

#[test]
fn writers_at_once_lease_a_segment_once_and_keep_their_bytes() {
    let (l, asks, _) = lazy(64);
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let l = &l;
            s.spawn(move || l.write(&[WriteOp { page: t as u64, data: &page(t + 1) }]).unwrap());
        }
    });
    assert_eq!(asks.load(SeqCst), 1);
    for t in 0..8u8 {
        let mut buf = page(0);
        l.read(&mut [ReadOp { page: t as u64, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page(t + 1), "page {t}");
    }
    assert_eq!(l.info().pages, 64, "the segment's size, not the lease's");
}

#[test]
fn a_refused_segment_fails_its_writes_clearly_then_asks_again() {
    let (l, asks, refuse) = lazy(64);
    refuse.store(1, SeqCst);
    let e = l.write(&[WriteOp { page: 0, data: &page(1) }]).unwrap_err();
    assert!(matches!(&e, StoreError::NoSpace(m) if m.contains("no room")), "{e}");
    // Within GROW_RETRY, refused at once without asking.
    let e = l.write(&[WriteOp { page: 0, data: &page(1) }]).unwrap_err();
    assert!(e.to_string().contains("no store yet"), "{e}");
    assert_eq!(asks.load(SeqCst), 1);
    refuse.store(0, SeqCst);
    std::thread::sleep(GROW_RETRY);
    l.write(&[WriteOp { page: 0, data: &page(9) }]).unwrap();
    assert_eq!(asks.load(SeqCst), 2);
    let mut buf = page(0);
    l.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
    assert_eq!(buf, page(9));
}

#[test]
fn writes_past_half_a_segment_lease_the_next_once_without_waiting() {
    let (tx, rx) = crate::lease::channel();
    let (asks, refuse) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    lease_thread(rx, Arc::clone(&asks), refuse);
    let like = RamStore::new(1, RamOptions::default()).unwrap().info();
    let seg = Arc::new(unleased_segment(3, 64, like, tx.clone()));
    let w = leasing_ahead(seg, 64, 3, 128, tx);
    w.write(&[WriteOp { page: 31, data: &page(1) }]).unwrap();
    assert_eq!(asks.load(SeqCst), 1, "segment 3 itself, and nothing ahead below its half");
    for p in 32..64 {
        w.write(&[WriteOp { page: p, data: &page(p as u8) }]).unwrap();
    }
    let ahead = || asks.load(SeqCst) >> 32;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ahead() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!((ahead(), asks.load(SeqCst) & 0xffff_ffff), (1, 1), "segment 4 asked for once");
    for p in [31u64, 32, 63] {
        let mut buf = page(0);
        w.read(&mut [ReadOp { page: p, buf: &mut buf }]).unwrap();
        assert_eq!(buf, page(if p == 31 { 1 } else { p as u8 }), "page {p}");
    }
}
