use super::*;
use crate::ram::{RamOptions, RamStore};
use std::sync::Arc;

fn store(pages: u64) -> Snapshots<RamStore> {
    Snapshots::new(RamStore::new(pages, RamOptions::default()).unwrap())
}

fn page(tag: u8) -> Vec<u8> {
    vec![tag; PAGE_SIZE]
}

fn write(s: &impl PageStore, p: u64, tag: u8) {
    s.write(&[WriteOp { page: p, data: &page(tag) }]).unwrap();
}

fn snap_read(s: &Snapshots<RamStore>, id: u64, p: u64) -> Vec<u8> {
    let mut buf = page(0xEE);
    s.read_snapshot(id, p, &mut buf).unwrap();
    buf
}

fn owing(pages: u64, owed: &[u64]) -> Owed {
    let mut o = Owed::new(pages);
    owed.iter().for_each(|&p| o.set(p));
    o
}

#[test]
fn an_owed_page_reads_as_it_was_after_writes_and_discards() {
    let s = store(8);
    (0..8).for_each(|p| write(&s, p, p as u8 + 1));
    let id = s.take(owing(8, &[1, 2, 3, 7])).unwrap();
    write(&s, 1, 0x51);
    write(&s, 1, 0x52);
    s.discard(2, 2).unwrap();
    write(&s, 0, 0x50); // not owed: nothing kept
    write(&s, 7, 8); // the same bytes again: nothing kept
    assert_eq!(snap_read(&s, id, 1), page(2));
    assert_eq!(snap_read(&s, id, 2), page(3));
    assert_eq!(snap_read(&s, id, 3), page(4));
    assert_eq!(snap_read(&s, id, 7), page(8), "never changed: read from the store");
    let stats = s.stats();
    assert_eq!((stats.live, stats.owed_pages, stats.kept_pages), (1, 4, 3));
    let mut buf = page(0);
    s.read(&mut [ReadOp { page: 1, buf: &mut buf }]).unwrap();
    assert_eq!(buf, page(0x52), "plain reads see the newest bytes");
    assert!(s.read_snapshot(id, 0, &mut buf).is_err(), "page 0 is not owed");
    s.release(id);
    assert_eq!(s.stats(), SnapshotStats { kept_pages_peak: 3, ..SnapshotStats::default() });
    assert!(s.read_snapshot(id, 1, &mut buf).is_err(), "released");
}

#[test]
fn two_snapshots_each_keep_their_own_moment() {
    let s = store(4);
    write(&s, 0, 1);
    let first = s.take(owing(4, &[0])).unwrap();
    write(&s, 0, 2);
    let second = s.take(owing(4, &[0])).unwrap();
    write(&s, 0, 3);
    assert_eq!(snap_read(&s, first, 0), page(1));
    assert_eq!(snap_read(&s, second, 0), page(2));
    s.release(first);
    assert_eq!(snap_read(&s, second, 0), page(2));
}

#[test]
fn snapshots_past_the_limit_are_refused() {
    let s = store(4);
    let ids: Vec<u64> = (0..SNAPSHOTS_MAX).map(|_| s.take(Owed::new(4)).unwrap()).collect();
    assert!(matches!(s.take(Owed::new(4)), Err(StoreError::NoSpace(_))));
    s.release(ids[0]);
    s.take(Owed::new(4)).unwrap();
}

/// A reader of the snapshot racing a writer of the same pages never sees
/// a byte written after the snapshot.
#[test]
fn snapshot_reads_racing_writes_see_only_the_old_bytes() {
    const PAGES: u64 = 64;
    let s = Arc::new(store(PAGES));
    (0..PAGES).for_each(|p| write(&*s, p, 7));
    let id = s.take(owing(PAGES, &(0..PAGES).collect::<Vec<_>>())).unwrap();
    let writer = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || {
            for round in 0..20u8 {
                for p in 0..PAGES {
                    write(&*s, p, 100 + round);
                }
            }
        })
    };
    for _ in 0..20 {
        for p in 0..PAGES {
            assert_eq!(snap_read(&s, id, p), page(7), "page {p}");
        }
    }
    writer.join().unwrap();
    assert_eq!(s.stats().kept_pages, PAGES);
}

fn with_spill(pages: u64, spill_pages: u64) -> Snapshots<RamStore> {
    let s = store(pages);
    let spill = RamStore::new(spill_pages, RamOptions::default()).unwrap();
    assert!(s.set_spill(Box::new(spill)));
    assert!(s.has_spill());
    s
}

#[test]
fn kept_pages_go_to_the_spill_store_and_its_slots_are_reused() {
    let s = with_spill(8, 4);
    (0..8).for_each(|p| write(&s, p, p as u8 + 1));
    let first = s.take(owing(8, &[0, 1, 2, 3])).unwrap();
    (0..4).for_each(|p| write(&s, p, 0x40 + p as u8));
    (0..4).for_each(|p| assert_eq!(snap_read(&s, first, p), page(p as u8 + 1)));
    assert_eq!(s.stats().kept_pages, 4);
    s.release(first);
    // Every slot is free again: four more pages fit.
    let second = s.take(owing(8, &[4, 5, 6, 7])).unwrap();
    (4..8).for_each(|p| write(&s, p, 0x50));
    (4..8).for_each(|p| assert_eq!(snap_read(&s, second, p), page(p as u8 + 1)));
    assert_eq!(s.stats().given_up, 0);
    s.release(second);
    assert_eq!(s.stats().kept_pages, 0);
}

#[test]
fn a_full_spill_store_gives_the_snapshot_up_and_never_the_write() {
    let s = with_spill(8, 2);
    (0..8).for_each(|p| write(&s, p, 1));
    let id = s.take(owing(8, &[0, 1, 2])).unwrap();
    write(&s, 0, 2);
    write(&s, 1, 2);
    assert_eq!(snap_read(&s, id, 0), page(1));
    write(&s, 2, 2); // no slot left for its old bytes
    let mut buf = page(0);
    s.read(&mut [ReadOp { page: 2, buf: &mut buf }]).unwrap();
    assert_eq!(buf, page(2), "the write went through");
    assert!(s.read_snapshot(id, 0, &mut buf).is_err(), "the snapshot is given up");
    let stats = s.stats();
    assert_eq!((stats.given_up, stats.kept_pages), (1, 0));
    s.release(id);
    // A new snapshot has the whole spill store again.
    let next = s.take(owing(8, &[3, 4])).unwrap();
    write(&s, 3, 9);
    write(&s, 4, 9);
    assert_eq!(snap_read(&s, next, 4), page(1));
    s.release(next);
}

/// A page owed late (a lazy clean wrote the fork's bytes after the
/// snapshot): its first write before that is not kept, later ones are.
#[test]
fn a_page_owed_after_its_fork_write_keeps_only_later_writes() {
    let s = store(4);
    (0..4).for_each(|p| write(&s, p, 0x10 + p as u8));
    let id = s.take(owing(4, &[0])).unwrap();
    write(&s, 2, 0x22); // the fork's bytes, written after the snapshot
    assert!(s.read_snapshot(id, 2, &mut page(0)).is_err(), "not owed yet");
    assert_eq!(s.stats().kept_pages, 0, "a write of a page not owed keeps nothing");
    s.owe(id, &[2, 9_999]);
    write(&s, 2, 0x23);
    assert_eq!(snap_read(&s, id, 2), page(0x22));
    assert_eq!(s.stats().owed_pages, 2, "a page past the end is ignored");
    s.release(id);
    s.owe(id, &[1]); // released: nothing to owe
    assert_eq!(s.stats().owed_pages, 0);
}

#[test]
fn unchanged_is_true_until_a_write_or_discard_keeps_old_bytes() {
    let s = store(8);
    (0..8).for_each(|p| write(&s, p, p as u8 + 1));
    let id = s.take(owing(8, &[1, 2, 3])).unwrap();
    assert!(s.unchanged(id, 1).unwrap() && s.unchanged(id, 2).unwrap());
    write(&s, 1, 0x51);
    write(&s, 3, 4); // the same bytes again: nothing kept, still the snapshot's
    s.discard(2, 1).unwrap();
    assert!(!s.unchanged(id, 1).unwrap(), "written since");
    assert!(!s.unchanged(id, 2).unwrap(), "discarded since");
    assert!(s.unchanged(id, 3).unwrap());
    assert!(s.unchanged(id, 0).is_err(), "page 0 is not owed");
    s.release(id);
    assert!(s.unchanged(id, 3).is_err(), "released");
}
