//! The state every part of the fault handler reads and changes: the uffd,
//! the page table, the store, the counters and the budget. Each part
//! (`evict::Eviction`, `prefetch::Ahead`, `read_block::Blocks`,
//! `huge::Huge`) owns its own state and is handed this `Core`, so no part
//! names the `Handler` that joins them (`handler/mod.rs`), and the fault path
//! (`handler/resolve.rs`) reads from top to bottom in one place.

use crate::discards::Discards;
use crate::kernel::uffd::{resolve, Uffd};
use crate::state::PageTable;
use crate::stats::Counters;
use memlend_store::{PageStore, PAGE_SIZE};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What became of a fault.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Done,
    /// A UFFDIO call kept answering EAGAIN: an event (REMOVE, UNMAP) is
    /// queued behind this fault, and until we read it the kernel refuses
    /// to map pages. The message is consumed and its thread still waits.
    Again,
}

pub(crate) struct Core {
    pub uffd: Uffd,
    /// The staging mapping's own descriptor (see `Uffd::open_staging`);
    /// UFFDIO_MOVE into staging is issued on it.
    pub staging_uffd: Uffd,
    /// Start of the region; pages are `base + page * PAGE_SIZE`.
    pub base: usize,
    pub pages: u32,
    pub table: PageTable,
    pub store: Arc<dyn PageStore>,
    pub counters: Arc<Counters>,
    pub discards: Arc<Discards>,
    /// Pages the owner made inaccessible: nothing is mapped there ahead of
    /// a fault (`fences.rs`).
    pub fences: Arc<crate::fences::Fences>,
    pub budget_pages: usize,
    /// Kept out of the mapped pages while `held` exceeds the budget, for the
    /// staging halves and the prefetch windows, as they use it (`reserve.rs`).
    pub reserve: crate::reserve::Reserve,
    /// Rung by the fetch and write-back threads when a job is done.
    pub bell: Arc<crate::kernel::doorbell::Doorbell>,
    /// One page: the target of store reads.
    pub page_buf: crate::kernel::mem::PageBuf,
    /// One page of zeroes, copied in for write faults on empty pages.
    pub zero_page: Vec<u8>,
    /// Whether store pages are mapped writable or write-protected.
    pub intent: crate::intent::WriteIntent,
    /// The compressed local tier, if on (`zpool/mod.rs`).
    pub zpool: Option<crate::zpool::ZPool>,
    /// Pages whose bytes are gone (a write-back failed and they could not
    /// be put back): `Empty` in the table, but a fault on one raises SIGBUS
    /// rather than reading zeros, and nothing is mapped there ahead. A
    /// discard or unmap of the page (the program gave it up) clears it.
    pub lost: std::collections::BTreeSet<u32>,
    /// Every fault goes here too, if tracing (`trace.rs`).
    pub trace: Option<crate::trace::Trace>,
}

impl Core {
    pub(crate) fn page_addr(&self, page: u32) -> usize {
        self.base + page as usize * PAGE_SIZE
    }

    pub(crate) fn publish_resident(&self) {
        let resident = self.table.resident() as u64;
        self.counters.pages_resident.store(resident, Relaxed);
        self.counters.reserve_pages.store(self.reserve.pages() as u64, Relaxed);
        self.counters.reserve_held_pages.store(self.reserve.held_pages() as u64, Relaxed);
        if let Some(pool) = &self.zpool {
            self.counters.publish_pool(&pool.stats());
        }
    }

    /// The most pages to keep mapped: the whole budget while the pages held
    /// fit it; else the budget less the handler's buffers, which then hold
    /// pages too (staged victims, windows being read).
    pub(crate) fn mapped_budget(&self) -> usize {
        if self.table.held() <= self.budget_pages {
            return self.budget_pages;
        }
        let pool_pages = self.zpool.as_ref().map_or(0, |pool| pool.charged_pages());
        let reserve = self.reserve.pages().min(self.budget_pages);
        (self.budget_pages - reserve).saturating_sub(pool_pages).max(1)
    }

    /// The faulting thread gets SIGBUS at this page instead of waiting forever.
    pub(crate) fn poison(&mut self, page: u32) -> Step {
        let page_addr = self.page_addr(page);
        match resolve(&self.uffd, page_addr, || self.uffd.poison(page_addr, PAGE_SIZE)) {
            Ok(()) => Counters::add(&self.counters.pages_poisoned, 1),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Step::Again,
            Err(e) => tracing::error!("fault handler: poisoning page {page} failed: {e}"),
        }
        Step::Done
    }
}
