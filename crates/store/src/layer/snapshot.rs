//! `snapshot`: the bytes that pages held at a moment, kept for as long as
//! someone still reads them (a forked child reading its parent's far pages
//! as they were at the fork).
//!
//! A snapshot names the pages it owes (the far pages at the fork; the pages
//! then resident went with the child's copy of the address space). Reads
//! through `read_snapshot` return what an owed page held when the snapshot
//! was taken. To keep that true, the first write or discard of an owed page
//! after the snapshot reads the old bytes and keeps them here first, as the
//! kernel copies a page on write (unless it writes the same bytes). So the memory this layer holds is bounded
//! by the owed pages written while the snapshot lives, never by reads.
//!
//! Ordering: a writer keeps a page's old bytes before its write starts, and
//! a snapshot read that went to the store looks for kept bytes after its
//! store read ended. A read that raced a write therefore either saw the old
//! bytes in the store or finds them kept. Writes of one page are not run
//! concurrently by this layer's callers (the fault handler writes a page
//! from one place at a time).
//!
//! Where the old bytes go: memory, or a spill store given with
//! `set_spill` (a file on local disk, `snapshot_spill.rs`). A snapshot that
//! cannot keep a page (the spill store is full or fails) is given up: its
//! reads fail from then on, and the write that wanted to keep goes on.
//!
//! With no snapshot live, a write costs one relaxed load.

use super::snapshot_spill::{broken, read_slot, write_slots, Kept, Spill};
use crate::{PageStore, ReadOp, StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Snapshots live at once: one a forked child that has not exited.
pub const SNAPSHOTS_MAX: usize = 16;

/// Old pages read from the store in one call before a write or discard.
const KEEP_BATCH_PAGES: usize = 64;

/// Which pages a snapshot owes, one bit a page.
#[derive(Clone, Debug, Default)]
pub struct Owed {
    bits: Vec<u64>,
}

impl Owed {
    pub fn new(pages: u64) -> Owed {
        Owed { bits: vec![0; pages.div_ceil(64) as usize] }
    }

    pub fn set(&mut self, page: u64) {
        self.bits[(page / 64) as usize] |= 1 << (page % 64);
    }

    pub fn has(&self, page: u64) -> bool {
        self.bits.get((page / 64) as usize).is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    pub fn count(&self) -> u64 {
        self.bits.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Pages the set can name (a multiple of 64 at least `new`'s count).
    fn pages(&self) -> u64 {
        self.bits.len() as u64 * 64
    }
}

/// Pages a snapshot owes from after it was taken (a lazy fork clean's,
/// as each page's write at the fork's bytes lands): set without the
/// layer's lock, which a spill file's I/O may hold for milliseconds, by
/// the fault handler's thread.
#[derive(Debug)]
pub struct LateOwed {
    bits: Vec<AtomicU64>,
}

impl LateOwed {
    fn new(pages: u64) -> LateOwed {
        LateOwed { bits: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Owe `pages` too, as the store holds them now. The caller makes sure
    /// no later write of these pages has started; a page past the end is
    /// ignored.
    pub fn owe(&self, pages: &[u32]) {
        for &page in pages {
            if let Some(word) = self.bits.get(page as usize / 64) {
                word.fetch_or(1 << (page % 64), Ordering::SeqCst);
            }
        }
    }

    fn has(&self, page: u64) -> bool {
        let word = self.bits.get((page / 64) as usize);
        word.is_some_and(|w| w.load(Ordering::SeqCst) & (1 << (page % 64)) != 0)
    }

    fn count(&self) -> u64 {
        self.bits.iter().map(|w| u64::from(w.load(Ordering::Relaxed).count_ones())).sum()
    }
}

struct Snap {
    id: u64,
    owed: Owed,
    late: Arc<LateOwed>,
    /// Old bytes of owed pages written or discarded since.
    kept: HashMap<u64, Kept>,
    /// Why the snapshot was given up, if it was: its reads fail.
    broken: Option<String>,
}

impl Snap {
    fn owes(&self, page: u64) -> bool {
        self.owed.has(page) || self.late.has(page)
    }
}

#[derive(Default)]
struct State {
    live: Vec<Snap>,
    next_id: u64,
    spill: Option<Spill>,
}

pub struct Snapshots<S> {
    inner: S,
    /// `state.live.len()`, read without the lock on every write.
    live: AtomicUsize,
    /// Pages kept now, and the most ever kept at once.
    kept_pages: AtomicU64,
    kept_pages_peak: AtomicU64,
    given_up: AtomicU64,
    state: Mutex<State>,
}

/// What the snapshots hold, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    pub live: usize,
    pub owed_pages: u64,
    pub kept_pages: u64,
    /// The most pages kept at once, since the layer was made.
    pub kept_pages_peak: u64,
    /// Snapshots given up because a page could not be kept.
    pub given_up: u64,
}

impl<S: PageStore> Snapshots<S> {
    pub fn new(inner: S) -> Snapshots<S> {
        Snapshots {
            inner,
            live: AtomicUsize::new(0),
            kept_pages: AtomicU64::new(0),
            kept_pages_peak: AtomicU64::new(0),
            given_up: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start owing `owed` as the store holds them now. The caller makes sure
    /// no write of an owed page is in flight (the fault handler is paused).
    pub fn take(&self, owed: Owed) -> StoreResult<u64> {
        let mut state = self.lock();
        if state.live.len() >= SNAPSHOTS_MAX {
            return Err(StoreError::NoSpace(format!(
                "{SNAPSHOTS_MAX} snapshots are live (forked children that have not exited)"
            )));
        }
        let id = state.next_id;
        state.next_id += 1;
        let late = Arc::new(LateOwed::new(owed.pages()));
        state.live.push(Snap { id, owed, late, kept: HashMap::new(), broken: None });
        self.live.store(state.live.len(), Ordering::SeqCst);
        Ok(id)
    }

    /// Owe `pages` too, as the store holds them now: for a fork whose dirty
    /// pages are written after it (the fault handler's lazy clean), each
    /// joins the snapshot once its write at the fork's bytes has landed. The
    /// caller makes sure no later write of these pages has started. A
    /// snapshot released or given up meanwhile owes nothing more.
    pub fn owe(&self, id: u64, pages: &[u32]) {
        if let Some(late) = self.late_owed(id) {
            late.owe(pages);
        }
    }

    /// Snapshot `id`'s pages owed late, to `owe` them without this layer's
    /// lock. None if it was released.
    pub fn late_owed(&self, id: u64) -> Option<Arc<LateOwed>> {
        self.lock().live.iter().find(|s| s.id == id).map(|s| Arc::clone(&s.late))
    }

    /// Keep old bytes in `spill` (one slot a page) from now on, not in
    /// memory. Only the first call counts; whether it did.
    pub fn set_spill(&self, spill: Box<dyn PageStore>) -> bool {
        let mut state = self.lock();
        if state.spill.is_some() {
            return false;
        }
        state.spill = Some(Spill::new(spill));
        true
    }

    pub fn has_spill(&self) -> bool {
        self.lock().spill.is_some()
    }

    /// Forget a snapshot and the bytes kept for it.
    pub fn release(&self, id: u64) {
        let mut state = self.lock();
        let Some(at) = state.live.iter().position(|s| s.id == id) else { return };
        let mut snap = state.live.swap_remove(at);
        let none_live = state.live.is_empty();
        self.forget_kept(state.spill.as_mut(), &mut snap, none_live);
        self.live.store(state.live.len(), Ordering::SeqCst);
    }

    /// Drop what `snap` kept (it is released, or given up). `none_live`:
    /// no other snapshot holds a slot.
    fn forget_kept(&self, spill: Option<&mut Spill>, snap: &mut Snap, none_live: bool) {
        self.kept_pages.fetch_sub(snap.kept.len() as u64, Ordering::Relaxed);
        let slots = snap.kept.drain().filter_map(|(_, k)| match k {
            Kept::Spilled(slot) => Some(slot),
            Kept::Ram(_) => None,
        });
        if let Some(spill) = spill {
            spill.give_back(slots, none_live);
        }
    }

    pub fn stats(&self) -> SnapshotStats {
        let state = self.lock();
        SnapshotStats {
            live: state.live.len(),
            owed_pages: state.live.iter().map(|s| s.owed.count() + s.late.count()).sum(),
            kept_pages: state.live.iter().map(|s| s.kept.len() as u64).sum(),
            kept_pages_peak: self.kept_pages_peak.load(Ordering::Relaxed),
            given_up: self.given_up.load(Ordering::Relaxed),
        }
    }

    /// Page `page` as it was when snapshot `id` was taken, into `buf` (one
    /// page). A page the snapshot does not owe is an error: whoever reads
    /// it already had it.
    pub fn read_snapshot(&self, id: u64, page: u64, buf: &mut [u8]) -> StoreResult<()> {
        assert_eq!(buf.len(), PAGE_SIZE, "one page at a time");
        if self.kept_into(id, page, buf)? {
            return Ok(());
        }
        self.inner.read(&mut [ReadOp { page, buf: &mut *buf }])?;
        // A write that raced the read kept the old bytes before it began.
        self.kept_into(id, page, buf)?;
        Ok(())
    }

    /// Whether snapshot `id` owes `page` and nothing has changed the
    /// store's copy since it was taken (no old bytes kept): then the store,
    /// and any copy of the page made from it since, holds the snapshot's
    /// bytes. Errors as `read_snapshot` does for a page it cannot read.
    pub fn unchanged(&self, id: u64, page: u64) -> StoreResult<bool> {
        let state = self.lock();
        Ok(!owing_snap(&state, id, page)?.kept.contains_key(&page))
    }

    /// Copy kept bytes of `page` into `buf`: whether there were any. A
    /// spilled page is read with the lock held, so its slot cannot be given
    /// back and reused meanwhile.
    fn kept_into(&self, id: u64, page: u64, buf: &mut [u8]) -> StoreResult<bool> {
        let state = self.lock();
        let snap = owing_snap(&state, id, page)?;
        match snap.kept.get(&page) {
            Some(Kept::Ram(bytes)) => buf.copy_from_slice(bytes),
            Some(&Kept::Spilled(slot)) => {
                let spill = state.spill.as_ref().expect("a spilled page has a spill store");
                read_slot(spill.store(), slot, buf)?;
            }
            None => return Ok(false),
        }
        Ok(true)
    }

    /// Before `pages` change (each with its new bytes, None for a discard):
    /// keep the old bytes of those a live snapshot owes and has not kept
    /// yet, unless the new bytes are the same (a page written back as it
    /// was, such as one that eviction had to dirty to move it).
    fn keep_old<'a>(
        &self,
        pages: impl Iterator<Item = (u64, Option<&'a [u8]>)>,
    ) -> StoreResult<()> {
        if self.live.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        let wanted: Vec<(u64, Option<&[u8]>)> = {
            let state = self.lock();
            let owes = |p: u64| state.live.iter().any(|s| s.owes(p) && !s.kept.contains_key(&p));
            pages.filter(|&(p, _)| owes(p)).collect()
        };
        for chunk in wanted.chunks(KEEP_BATCH_PAGES) {
            let mut old = vec![0u8; chunk.len() * PAGE_SIZE];
            let mut ops: Vec<ReadOp<'_>> = chunk
                .iter()
                .zip(old.chunks_exact_mut(PAGE_SIZE))
                .map(|(&(page, _), buf)| ReadOp { page, buf })
                .collect();
            self.inner.read(&mut ops)?;
            let changed: Vec<(u64, &[u8])> = chunk
                .iter()
                .zip(old.chunks_exact(PAGE_SIZE))
                .filter(|&(&(_, new), bytes)| new != Some(bytes))
                .map(|(&(page, _), bytes)| (page, bytes))
                .collect();
            let mut state = self.lock();
            // Bounded by SNAPSHOTS_MAX.
            for at in 0..state.live.len() {
                self.keep_for(&mut state, at, &changed);
            }
        }
        Ok(())
    }

    /// Keep, for snapshot `at`, the old bytes of the `changed` pages it owes
    /// and has not kept: in the spill store if there is one, else in memory.
    /// If the spill store cannot take them, the snapshot is given up.
    fn keep_for(&self, state: &mut State, at: usize, changed: &[(u64, &[u8])]) {
        let State { live, spill, .. } = state;
        let snap = &mut live[at];
        if snap.broken.is_some() {
            return;
        }
        let wanted: Vec<(u64, &[u8])> = changed
            .iter()
            .filter(|(page, _)| snap.owes(*page) && !snap.kept.contains_key(page))
            .copied()
            .collect();
        if wanted.is_empty() {
            return;
        }
        let kept: Vec<Kept> = match spill.as_mut() {
            None => wanted.iter().map(|(_, bytes)| Kept::Ram((*bytes).into())).collect(),
            Some(spill) => match spill_pages(spill, &wanted) {
                Ok(slots) => slots.into_iter().map(Kept::Spilled).collect(),
                Err(e) => {
                    tracing::error!("snapshot {}: {}", snap.id, broken(&e));
                    snap.broken = Some(broken(&e));
                    self.given_up.fetch_add(1, Ordering::Relaxed);
                    self.forget_kept(Some(spill), snap, false);
                    return;
                }
            },
        };
        for ((page, _), k) in wanted.iter().zip(kept) {
            snap.kept.insert(*page, k);
        }
        let now = self.kept_pages.fetch_add(wanted.len() as u64, Ordering::Relaxed);
        self.kept_pages_peak.fetch_max(now + wanted.len() as u64, Ordering::Relaxed);
    }
}

/// Snapshot `id`, if it is live, whole and owes `page`.
fn owing_snap(state: &State, id: u64, page: u64) -> StoreResult<&Snap> {
    let snap = state
        .live
        .iter()
        .find(|s| s.id == id)
        .ok_or_else(|| StoreError::Unavailable(format!("snapshot {id} was released")))?;
    if let Some(why) = &snap.broken {
        return Err(StoreError::Unavailable(why.clone()));
    }
    if !snap.owes(page) {
        return Err(StoreError::OutOfRange { page, count: 1, pages: 0 });
    }
    Ok(snap)
}

/// Write `pages` into fresh slots of `spill`: their slots, in order.
fn spill_pages(spill: &mut Spill, pages: &[(u64, &[u8])]) -> StoreResult<Vec<u64>> {
    let slots = spill.take_slots(pages.len());
    let result = if slots.len() < pages.len() {
        Err(StoreError::NoSpace(format!(
            "the spill store is full ({} pages)",
            spill.store().info().pages
        )))
    } else {
        let bytes: Vec<u8> = pages.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        write_slots(spill.store(), &slots, &bytes)
    };
    match result {
        Ok(()) => Ok(slots),
        Err(e) => {
            spill.give_back(slots.into_iter(), false);
            Err(e)
        }
    }
}

fn pages_of<'a>(ops: &'a [WriteOp<'a>]) -> impl Iterator<Item = (u64, Option<&'a [u8]>)> + 'a {
    ops.iter().flat_map(|op| {
        let pages = op.page..op.page + (op.data.len() / PAGE_SIZE) as u64;
        pages.zip(op.data.chunks_exact(PAGE_SIZE).map(Some))
    })
}

impl<S: PageStore> PageStore for Snapshots<S> {
    fn info(&self) -> StoreInfo {
        let info = self.inner.info();
        StoreInfo { name: format!("snapshot({})", info.name), ..info }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.keep_old(pages_of(ops))?;
        self.inner.write(ops)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        crate::check_range(self.inner.info().pages, page, count)?;
        self.keep_old((page..page + count).map(|p| (p, None)))?;
        self.inner.discard(page, count)
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }

    fn in_place(&self, page: u64, count: u64) -> Option<StoreResult<crate::InPlace>> {
        self.inner.in_place(page, count)
    }

    fn allocation(
        &self,
        page: u64,
        count: u64,
        out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        self.inner.allocation(page, count, out)
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
