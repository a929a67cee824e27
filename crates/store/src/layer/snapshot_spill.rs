//! Where a snapshot keeps the old bytes of the pages written while it
//! lives: in memory, or in a spill store (an unlinked file on local disk,
//! made by the caller) so that they cost no memory.
//!
//! Why: the parent of a forked child keeps one old page for every owed page
//! it rewrites while the child reads. A write-heavy redis rewrote tens of
//! MiB a second during its BGSAVE; kept in memory, that OOM-killed it under
//! a binding memory limit within 8 s. On disk, the cost is a write a page
//! kept and a read a page the child asks for.
//!
//! Slots of the spill store are handed out from a free list and the next
//! unused slot; a full spill store refuses, and the caller then gives up
//! the snapshot rather than the write (`Snapshots::keep_old`).

use crate::{PageStore, ReadOp, StoreError, StoreResult, WriteOp};

/// Old bytes of one page.
pub(super) enum Kept {
    Ram(Box<[u8]>),
    /// In slot `n` of the spill store.
    Spilled(u64),
}

pub(super) struct Spill {
    store: Box<dyn PageStore>,
    /// Slots given back, reused first.
    free: Vec<u64>,
    /// Slots below this have been handed out at some time.
    next: u64,
}

impl Spill {
    pub(super) fn new(store: Box<dyn PageStore>) -> Spill {
        Spill { store, free: Vec::new(), next: 0 }
    }

    /// Up to `count` free slots; fewer if the store is full.
    pub(super) fn take_slots(&mut self, count: usize) -> Vec<u64> {
        let mut slots: Vec<u64> =
            self.free.drain(self.free.len().saturating_sub(count)..).collect();
        let fresh = (count - slots.len()) as u64;
        let room = self.store.info().pages - self.next;
        slots.extend(self.next..self.next + fresh.min(room));
        self.next += fresh.min(room);
        slots
    }

    /// Give slots back. With `none_live`, every slot is free: the store is
    /// emptied (a file's blocks are given back to the filesystem).
    pub(super) fn give_back(&mut self, slots: impl Iterator<Item = u64>, none_live: bool) {
        if none_live {
            if self.next > 0 {
                if let Err(e) = self.store.discard(0, self.next) {
                    tracing::warn!("snapshot spill: emptying {} pages: {e}", self.next);
                }
            }
            self.free.clear();
            self.next = 0;
        } else {
            self.free.extend(slots);
        }
    }

    pub(super) fn store(&self) -> &dyn PageStore {
        self.store.as_ref()
    }
}

/// Write `pages` (one per slot, in order) into their slots.
pub(super) fn write_slots(store: &dyn PageStore, slots: &[u64], pages: &[u8]) -> StoreResult<()> {
    let ops: Vec<WriteOp<'_>> = slots
        .iter()
        .zip(pages.chunks_exact(crate::PAGE_SIZE))
        .map(|(&page, data)| WriteOp { page, data })
        .collect();
    store.write(&ops)
}

/// Read slot `slot` into `buf` (one page).
pub(super) fn read_slot(store: &dyn PageStore, slot: u64, buf: &mut [u8]) -> StoreResult<()> {
    store.read(&mut [ReadOp { page: slot, buf }])
}

/// A snapshot that could not keep a page: it no longer knows every owed
/// page's old bytes, so every read of it fails from now on.
pub(super) fn broken(why: &StoreError) -> String {
    format!("this snapshot could not keep a page's old bytes ({why}); its reads fail")
}
