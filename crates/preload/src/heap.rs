//! The far heap once made: one far-memory region and the arena that
//! carves it into page-granular blocks (`far.rs` makes it, on the first
//! large allocation).

use crate::arena::Arena;
use memlend_fault::Region;
use memlend_store::layer::snapshot::Snapshots;
use memlend_store::{PageStore, PAGE_SIZE};
use std::sync::{Arc, Mutex, MutexGuard};

/// The region's store, keeping what forked children still read.
pub type SnapshotStore = Snapshots<Arc<dyn PageStore>>;

pub struct Heap {
    pub region: Region,
    pub snapshots: Arc<SnapshotStore>,
    arena: Mutex<Arena>,
    pub describe: String,
    /// The layers keeping second copies (with `--redundancy`), for the report.
    pub copies: memlend_borrow::Copies,
    /// What the named layers (`memlend run --layers`) say, for the report.
    pub reports: Vec<memlend_store::layer::registry::Report>,
}

impl Heap {
    pub fn new(
        region: Region,
        snapshots: Arc<SnapshotStore>,
        pages: u64,
        describe: String,
        copies: memlend_borrow::Copies,
        reports: Vec<memlend_store::layer::registry::Report>,
    ) -> Heap {
        Heap { region, snapshots, arena: Mutex::new(Arena::new(pages)), describe, copies, reports }
    }

    pub fn arena(&self) -> MutexGuard<'_, Arena> {
        self.arena.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn addr(&self, page: u64) -> usize {
        self.region.as_ptr() as usize + page as usize * PAGE_SIZE
    }

    pub fn page_of(&self, addr: usize) -> u64 {
        ((addr - self.region.as_ptr() as usize) / PAGE_SIZE) as u64
    }

    /// The program made pages inaccessible (`fenced`: PROT_NONE) or
    /// accessible: the handler maps nothing ahead of a fault into fenced
    /// ones (`memlend_fault::Region::fence`).
    pub fn fence(&self, page: u64, pages: u64, fenced: bool) {
        let (off, len) = (page as usize * PAGE_SIZE, pages as usize * PAGE_SIZE);
        if let Err(e) = self.region.fence(off, len, fenced) {
            tracing::debug!("fencing far pages {page}+{pages}: {e}");
        }
    }

    /// Drop pages' contents: they read as zero after, cost no local budget
    /// and hold nothing in the store. Called before pages go back to the
    /// arena, so a new owner can never lose a write to it.
    pub fn discard(&self, page: u64, pages: u64) {
        let (off, len) = (page as usize * PAGE_SIZE, pages as usize * PAGE_SIZE);
        if let Err(e) = self.region.discard(off, len) {
            tracing::error!("discarding far pages {page}+{pages}: {e}");
        }
    }
}
