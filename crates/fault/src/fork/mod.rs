//! Forks: a child sees the region as it was at the fork.
//!
//! - `fork/pause.rs`: the owner holds the handler still while it forks;
//! - `clean.rs` (eager) and `lazy.rs` (after the fork): the dirty pages are
//!   written, so that the child may drop what it shares and read the rest
//!   through its parent;
//! - `fork/unshare.rs`: pages the fork shared are made ours before eviction
//!   moves them;
//! - `copy.rs`: a child's page answered from the parent's own memory;
//! - `child/`: the child's own handler and its link to the parent.
//!
//! The handler owns the fork state (`Forks`), apart from the state every
//! part shares (`shared::Core`): eviction meets it only through
//! `evict::BeforeMove`, so no part below the handler names a fork.

pub(crate) mod child;
pub(crate) mod clean;
pub(crate) mod copy;
pub(crate) mod lazy;
mod page_bits;
pub(crate) mod pause;
mod unshare;

use crate::evict::BeforeMove;
use crate::shared::Core;
use crate::state::PageTable;

/// What the last fork left for the handler to do: its dirty pages to write
/// after it (`lazy.rs`), and its shared pages to unshare before they move
/// out (`fork/unshare.rs`).
#[derive(Default)]
pub(crate) struct Forks {
    lazy: lazy::LazyClean,
    shared: unshare::ForkShared,
}

impl Forks {
    /// Pending pages are left to write between faults.
    pub(crate) fn busy(&self) -> bool {
        self.lazy.busy()
    }

    /// Between faults: write the next few pending pages.
    pub(crate) fn write_some(&mut self, core: &mut Core) {
        self.lazy.write_some(core);
    }

    /// Before the next fork's pause: every page pending from this one.
    pub(crate) fn write_all(&mut self, core: &mut Core) {
        self.lazy.write_all(core);
    }

    /// A write faulted on `page`: if the last fork's child still needs
    /// its bytes, they go to the store first.
    pub(crate) fn before_write(&mut self, core: &mut Core, page: u32) {
        if self.lazy.has(page) {
            self.lazy.write_before_change(core, page);
        }
    }

    /// Pages `first..first + count` were discarded or unmapped: whatever
    /// they hold next is not the fork's, so its child keeps its copies.
    pub(crate) fn forget(&mut self, first: u32, count: u32) {
        self.lazy.forget(first, count);
    }

    /// At the pause, as the owner forks: the mapped pages are shared with
    /// the child, and `pending` (one bit a page) are written after it,
    /// with `sink` told which landed.
    pub(crate) fn forked(
        &mut self,
        table: &PageTable,
        pages: u32,
        pending: Vec<u64>,
        sink: Option<Box<dyn lazy::ForkWritten>>,
    ) {
        self.shared.mark_mapped(pages, |page| table.get(page));
        self.lazy.start(pending, sink);
    }
}

impl BeforeMove for Forks {
    fn before_move(&mut self, core: &mut Core, victims: &[u32]) {
        self.lazy.write_victims(core, victims);
        self.shared.unshare_victims(core, victims);
    }
}
