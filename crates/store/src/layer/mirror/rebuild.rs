//! The rebuilder: replaces failed legs with spares and fills them.
//!
//! Order of events for one spare, and why each step is safe:
//! 1. The spare joins the list of legs as REBUILDING: from now on every new
//!    write and discard also goes to it, but no read does.
//! 2. Barrier: take every stripe lock once. A writer holds its stripes from
//!    before it takes its snapshot of the legs until it is done, so after
//!    the barrier no writer is left with a snapshot that lacks the spare.
//! 3. Copy every written page, 64 pages (one bitmap word) at a time, under
//!    those pages' stripe locks: no writer changes them meanwhile, and any
//!    write after the copy reaches the spare itself. Pages never written
//!    read as zeroes on a fresh spare and are skipped.
//! 4. Promote the spare to HEALTHY.

use super::{Leg, LockSet, Shared, SpareRequest};
use crate::{PageStore, ReadOp};
use crate::{StoreError, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

pub(super) fn spawn(shared: Arc<Shared>) -> StoreResult<std::thread::JoinHandle<()>> {
    let t = std::thread::Builder::new().name("memlend-mirror".into()).spawn(move || run(&shared));
    t.map_err(StoreError::Io)
}

fn run(s: &Shared) {
    loop {
        {
            let mut sig = s.signal.lock();
            while !sig.stop && !sig.work {
                s.wake.wait(&mut sig);
            }
            if sig.stop {
                return;
            }
            sig.work = false;
        }
        while let Some(slot) = s.snapshot().iter().position(|l| l.is_failed()) {
            if let Err(e) = replace(s, slot) {
                tracing::warn!(error = %e, "cannot rebuild a lost copy yet; will retry");
                let mut sig = s.signal.lock();
                if !sig.stop {
                    s.wake.wait_for(&mut sig, s.opts.spare_retry);
                }
            }
            if s.signal.lock().stop {
                return;
            }
        }
    }
}

/// Replace the failed leg in `slot` with a spare and fill it.
fn replace(s: &Shared, slot: usize) -> StoreResult<()> {
    let mut avoid: Vec<String> = s.snapshot().iter().map(|l| l.label.clone()).collect();
    avoid.extend(s.failed_labels.lock().iter().cloned());
    let spare = s.spare.as_ref().expect("the rebuilder runs only with a spare maker");
    let (mut store, label) = spare(&SpareRequest { pages: s.pages, avoid: &avoid })?;
    if s.sums.is_none() && !store.info().caps.checked {
        // With no sums here, every leg must check its own pages.
        store = Arc::new(crate::layer::Checksum::new(store)?);
    }
    if store.info().pages < s.pages {
        let has = store.info().pages;
        return Err(StoreError::NoSpace(format!("spare at {label} holds {has} pages")));
    }
    let leg = Leg::rebuilding(store, label);
    {
        let mut legs = s.legs.write();
        let mut next = legs.to_vec();
        next[slot] = Arc::clone(&leg);
        *legs = next.into();
    }
    drop(s.locks.write(&LockSet::of_run(0, crate::page_locks::STRIPES as u64)));
    s.counters.rebuilding.store(true, Relaxed);
    let started = Instant::now();
    let copied = copy_all(s, &leg);
    s.counters.rebuilding.store(false, Relaxed);
    let pages = copied?;
    if !leg.promote() {
        return Err(StoreError::Unavailable(format!(
            "spare at {} failed while filling",
            leg.label
        )));
    }
    s.counters.rebuilds.fetch_add(1, Relaxed);
    let ms = started.elapsed().as_millis() as u64;
    tracing::info!(leg = %leg.label, pages, ms, "lost copy rebuilt");
    Ok(())
}

fn copy_all(s: &Shared, leg: &Arc<Leg>) -> StoreResult<u64> {
    let mut buf = vec![0u8; 64 * PAGE_SIZE];
    let mut copied = 0;
    for word in 0..s.written.words() {
        if s.signal.lock().stop {
            return Err(StoreError::Unavailable("stopped".into()));
        }
        if leg.is_failed() {
            return Err(StoreError::Unavailable(format!("spare at {} failed", leg.label)));
        }
        if s.written.word(word) != 0 {
            copied += copy_word(s, leg, word, &mut buf)?;
        }
    }
    Ok(copied)
}

/// Copy the written pages among `64 * word ..+ 64` to `leg`.
fn copy_word(s: &Shared, leg: &Arc<Leg>, word: u64, buf: &mut [u8]) -> StoreResult<u64> {
    let first = word * 64;
    let n = 64.min(s.pages - first);
    let _owned = s.locks.write(&LockSet::of_run(first, n));
    let bits = s.written.word(word);
    let runs = runs_of(bits, first, n);
    let mut ops = Vec::with_capacity(runs.len());
    let mut rest = &mut buf[..];
    for &(page, count) in &runs {
        let (head, tail) = rest.split_at_mut(count as usize * PAGE_SIZE);
        ops.push(ReadOp { page, buf: head });
        rest = tail;
    }
    read_from_a_good_leg(s, leg, &mut ops)?;
    let writes: Vec<WriteOp> =
        ops.iter().map(|op| WriteOp { page: op.page, data: op.buf }).collect();
    if let Err(e) = leg.store.write(&writes) {
        s.leg_failed(leg, &e, "rebuild");
        return Err(e);
    }
    let pages: u64 = runs.iter().map(|r| r.1).sum();
    s.counters.pages_rebuilt.fetch_add(pages, Relaxed);
    Ok(pages)
}

/// Fill `ops` from a healthy leg other than `target`, page sums checked; a
/// page no leg holds intact is counted lost and left as read.
fn read_from_a_good_leg(s: &Shared, target: &Arc<Leg>, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
    loop {
        let legs = s.snapshot();
        let source = legs.iter().find(|l| l.is_healthy() && !Arc::ptr_eq(l, target));
        let Some(source) = source.cloned() else {
            return Err(StoreError::Unavailable("no healthy copy left to rebuild from".into()));
        };
        match source.store.read(ops) {
            Ok(()) => return check_pages(s, &source, ops, false),
            // A leg that checks its pages found a bad one and returned the
            // rest: a bad copy, not a dead leg.
            Err(StoreError::Corrupt { .. }) => return check_pages(s, &source, ops, true),
            Err(e) => s.leg_failed(&source, &e, "rebuild read"),
        }
    }
}

/// Check copied pages (`corrupt`: the source said some were bad); fix bad
/// ones from any other healthy leg.
fn check_pages(
    s: &Shared,
    source: &Arc<Leg>,
    ops: &mut [ReadOp<'_>],
    corrupt: bool,
) -> StoreResult<()> {
    for op in ops.iter_mut() {
        for (i, page_buf) in op.buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let page = op.page + i as u64;
            if !s.suspect(page, page_buf, corrupt)
                || s.read_verified(page, page_buf, source).is_ok()
            {
                continue;
            }
            s.counters.bad_copies.fetch_add(1, Relaxed);
            let legs = s.snapshot();
            let mut others = legs.iter().filter(|l| l.is_healthy() && !Arc::ptr_eq(l, source));
            if !others.any(|l| s.read_verified(page, page_buf, l).is_ok()) {
                s.counters.lost_pages.fetch_add(1, Relaxed);
                tracing::error!(page, "no leg holds a good copy of the page to rebuild from");
            }
        }
    }
    Ok(())
}

/// Runs of set bits in `bits` (page `first + i` for bit `i`, `i < n`), as
/// (first page, count).
fn runs_of(bits: u64, first: u64, n: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for i in (0..n).filter(|i| bits & (1 << i) != 0) {
        match runs.last_mut() {
            Some((p, c)) if *p + *c == first + i => *c += 1,
            _ => runs.push((first + i, 1)),
        }
    }
    runs
}

#[cfg(test)]
#[test]
fn runs_of_groups_consecutive_bits() {
    assert_eq!(runs_of(0b1011_0001, 64, 64), vec![(64, 1), (68, 2), (71, 1)]);
    assert_eq!(runs_of(u64::MAX, 0, 64), vec![(0, 64)]);
    assert_eq!(runs_of(u64::MAX, 128, 3), vec![(128, 3)]);
    assert_eq!(runs_of(0, 0, 64), vec![]);
}
