//! Per-page state, owned by the handler thread alone (so it needs no atomics).
//!
//! ```text
//!   Empty ──fault: zero-fill──▶ Dirty ──evict: move out, write──▶ InStore
//!                               ▲ ▲                               │  ▲
//!                     WP fault  │ └──write fault: read, COPY──────┤  │
//!                               │                                 │  │
//!                             Clean ◀──read fault: read, COPY+WP──┘  │
//!                               └──────evict: move out, no write─────┘
//! ```
//! (A `Dirty` victim that is all zeroes goes back to `Empty` instead; any
//! page the owner frees, discards or unmaps goes back to `Empty` too.)
//! `Clean` pages are mapped write-protected and their store copy is current;
//! the first write to one raises a WP fault that makes it `Dirty`.

use std::collections::VecDeque;

/// The two low bits of a page's byte; the dirty bit is the `Clean`/`Dirty`
/// split.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// Never written out: a fault zero-fills it with no store I/O.
    Empty = 0,
    /// Mapped write-protected; the store holds these very bytes.
    Clean = 1,
    /// Mapped writable; the store's copy (if any) may be stale.
    Dirty = 2,
    /// Not mapped; its bytes are in the store.
    InStore = 3,
}

impl PageState {
    pub fn is_resident(self) -> bool {
        matches!(self, PageState::Clean | PageState::Dirty)
    }

    fn from_bits(byte: u8) -> PageState {
        match byte & STATE_MASK {
            0 => PageState::Empty,
            1 => PageState::Clean,
            2 => PageState::Dirty,
            _ => PageState::InStore,
        }
    }
}

const STATE_MASK: u8 = 0b11;
/// The page has an entry in the eviction queue. Every resident page has
/// one; a page discarded while resident keeps its (now stale) entry, which
/// eviction skips, or which the page reuses if it is mapped again first. So
/// no page ever has two entries.
const QUEUED: u8 = 1 << 2;

const _: () = assert!(METADATA_BYTES_PER_PAGE <= 16);

/// Bytes of bookkeeping per page at most: the state byte, plus a 4-byte slot
/// in the eviction queue while the page is resident (or its entry is stale).
pub const METADATA_BYTES_PER_PAGE: usize = size_of::<u8>() + size_of::<u32>();

/// Page states plus the resident pages in fault-in order (FIFO eviction).
pub struct PageTable {
    bits: Vec<u8>,
    fifo: VecDeque<u32>,
    resident: usize,
    /// Stale entries allowed in the queue before it is compacted.
    stale_limit: usize,
}

impl PageTable {
    pub fn new(pages: u32, budget_pages: usize) -> PageTable {
        PageTable {
            bits: vec![PageState::Empty as u8; pages as usize],
            fifo: VecDeque::new(),
            resident: 0,
            stale_limit: (budget_pages / 4).max(64),
        }
    }

    /// Heap bytes held, for the metadata budget.
    #[cfg(test)]
    pub fn metadata_bytes(&self) -> usize {
        self.bits.capacity() + self.fifo.capacity() * size_of::<u32>()
    }

    pub fn get(&self, page: u32) -> PageState {
        PageState::from_bits(self.bits[page as usize])
    }

    /// Pages mapped now, not counting victims being evicted.
    pub fn resident(&self) -> usize {
        self.resident
    }

    fn set(&mut self, page: u32, now: PageState) {
        let byte = &mut self.bits[page as usize];
        *byte = (*byte & !STATE_MASK) | now as u8;
    }

    fn flag(&self, page: u32, flag: u8) -> bool {
        self.bits[page as usize] & flag != 0
    }

    fn set_flag(&mut self, page: u32, flag: u8, on: bool) {
        let byte = &mut self.bits[page as usize];
        *byte = if on { *byte | flag } else { *byte & !flag };
    }

    /// `page` was mapped, write-protected if `Clean`: it joins the queue's
    /// tail, or takes back the stale entry it still has.
    pub fn map(&mut self, page: u32, now: PageState) {
        debug_assert!(!self.get(page).is_resident());
        debug_assert!(now.is_resident());
        self.set(page, now);
        self.resident += 1;
        if !self.flag(page, QUEUED) {
            self.push(page);
        }
    }

    fn push(&mut self, page: u32) {
        self.set_flag(page, QUEUED, true);
        self.fifo.push_back(page);
    }

    /// A victim that stayed mapped rejoins the queue's tail, as it was.
    pub fn requeue(&mut self, page: u32) {
        debug_assert!(self.get(page).is_resident());
        self.resident += 1;
        self.push(page);
    }

    /// A resident page was (or may have been) written to: its store copy is
    /// stale from now on.
    pub fn dirtied(&mut self, page: u32) {
        debug_assert!(self.get(page).is_resident());
        self.set(page, PageState::Dirty);
    }

    /// Undo the latest [`PageTable::map`], of `page`, which was `was` before.
    /// Its queue entry stays, stale, for the page to reuse.
    pub fn unmap_newest(&mut self, page: u32, was: PageState) {
        debug_assert!(self.get(page).is_resident());
        self.set(page, was);
        self.resident -= 1;
    }

    /// Take up to `count` of the oldest resident pages as eviction victims.
    /// They leave the queue and the resident count but keep their
    /// `Clean`/`Dirty` state until the caller settles each one with
    /// [`PageTable::evicted`], [`PageTable::emptied`] or
    /// [`PageTable::requeue`]. Stale entries met on the way are dropped.
    pub fn take_victims(&mut self, count: usize, out: &mut Vec<u32>) {
        out.clear();
        while out.len() < count {
            let Some(page) = self.fifo.pop_front() else { break };
            self.set_flag(page, QUEUED, false);
            if self.get(page).is_resident() {
                self.resident -= 1;
                out.push(page);
            }
        }
    }

    /// A victim's bytes are now in the store.
    pub fn evicted(&mut self, page: u32) {
        self.set(page, PageState::InStore);
    }

    /// A victim had no page to move (dropped behind our back): it reads as
    /// zero next time, as MADV_DONTNEED promises.
    pub fn emptied(&mut self, page: u32) {
        self.set(page, PageState::Empty);
    }

    /// The owner dropped `page` (free, discard, munmap): it is `Empty`, out
    /// of the resident count, and any store copy is garbage. Its queue entry,
    /// if any, goes stale; the queue is compacted once too many are.
    pub fn forget(&mut self, page: u32) {
        if self.get(page).is_resident() {
            self.resident -= 1;
        }
        self.set(page, PageState::Empty);
    }

    /// Drop stale entries once they are more than `stale_limit`: this keeps
    /// the queue within `resident + stale_limit` entries however often the
    /// owner discards pages that are never evicted. Linear in the queue, so
    /// run it after a whole discarded range, not per page.
    pub fn compact_if_stale(&mut self) {
        if self.fifo.len() <= self.resident + self.stale_limit {
            return;
        }
        let mut fifo = std::mem::take(&mut self.fifo);
        fifo.retain(|&page| {
            let live = self.get(page).is_resident();
            if !live {
                self.set_flag(page, QUEUED, false);
            }
            live
        });
        fifo.shrink_to(self.resident + self.stale_limit);
        self.fifo = fifo;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_fits_in_16_bytes_per_page() {
        let pages = 4096;
        let mut table = PageTable::new(pages, pages as usize);
        for page in 0..pages {
            table.map(page, PageState::Dirty);
        }
        let per_page = table.metadata_bytes() / pages as usize;
        assert!(per_page <= 16, "{per_page} bytes per page");
        assert!(per_page <= 2 * METADATA_BYTES_PER_PAGE, "{per_page} bytes per page");
    }

    #[test]
    fn victims_leave_in_fault_in_order() {
        let mut table = PageTable::new(8, 8);
        for page in [5, 1, 7] {
            table.map(page, PageState::Dirty);
        }
        let mut victims = Vec::new();
        table.take_victims(2, &mut victims);
        assert_eq!(victims, [5, 1]);
        assert_eq!(table.resident(), 1);
        table.evicted(5);
        table.requeue(1);
        assert_eq!(table.get(5), PageState::InStore);
        assert_eq!(table.get(1), PageState::Dirty);
        table.take_victims(8, &mut victims);
        assert_eq!(victims, [7, 1]);
    }

    #[test]
    fn the_dirty_bit_survives_victim_selection() {
        let mut table = PageTable::new(4, 4);
        table.map(0, PageState::Clean);
        table.map(1, PageState::Clean);
        table.dirtied(1);
        let mut victims = Vec::new();
        table.take_victims(2, &mut victims);
        assert_eq!(table.get(0), PageState::Clean);
        assert_eq!(table.get(1), PageState::Dirty);
        table.requeue(1);
        assert_eq!(table.get(1), PageState::Dirty);
        assert_eq!(table.resident(), 1);
    }

    #[test]
    fn forgotten_pages_leave_the_count_and_are_never_victims() {
        let mut table = PageTable::new(8, 8);
        for page in 0..4 {
            table.map(page, PageState::Dirty);
        }
        table.forget(1);
        table.forget(6);
        assert_eq!(table.resident(), 3);
        assert_eq!(table.get(1), PageState::Empty);
        // Mapped again before its stale entry was met: it reuses it.
        table.forget(2);
        table.map(2, PageState::Clean);
        let mut victims = Vec::new();
        table.take_victims(8, &mut victims);
        assert_eq!(victims, [0, 2, 3]);
        assert_eq!(table.resident(), 0);
    }

    #[test]
    fn stale_entries_are_bounded() {
        let mut table = PageTable::new(1024, 16);
        for round in 0..100 {
            for page in 0..512 {
                table.map(page, PageState::Dirty);
            }
            for page in 0..512 {
                table.forget(page);
            }
            table.compact_if_stale();
            assert!(table.fifo.len() <= 64, "round {round}: {}", table.fifo.len());
        }
        // The queue grows only with pages actually mapped: 512 each round,
        // never the 51 200 mapped over all rounds.
        assert!(table.fifo.capacity() <= 1024, "{}", table.fifo.capacity());
    }
}
