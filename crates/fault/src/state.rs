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
//! (A `Dirty` victim that is all zeroes goes back to `Empty` instead.)
//! `Clean` pages are mapped write-protected and their store copy is current;
//! the first write to one raises a WP fault that makes it `Dirty`. A page
//! leaves `Clean`/`Dirty` only through eviction.

use std::collections::VecDeque;

/// One byte per page; the dirty bit is the `Clean`/`Dirty` split.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// Never written out: a fault zero-fills it with no store I/O.
    Empty,
    /// Mapped write-protected; the store holds these very bytes.
    Clean,
    /// Mapped writable; the store's copy (if any) may be stale.
    Dirty,
    /// Not mapped; its bytes are in the store.
    InStore,
}

impl PageState {
    pub fn is_resident(self) -> bool {
        matches!(self, PageState::Clean | PageState::Dirty)
    }
}

const _: () = assert!(METADATA_BYTES_PER_PAGE <= 16);

/// Bytes of bookkeeping per page at most: the state byte, plus a 4-byte slot
/// in the eviction queue while the page is resident.
pub const METADATA_BYTES_PER_PAGE: usize = size_of::<PageState>() + size_of::<u32>();

/// Page states plus the resident pages in fault-in order (FIFO eviction).
pub struct PageTable {
    state: Vec<PageState>,
    fifo: VecDeque<u32>,
}

impl PageTable {
    pub fn new(pages: u32) -> PageTable {
        PageTable { state: vec![PageState::Empty; pages as usize], fifo: VecDeque::new() }
    }

    /// Heap bytes held, for the metadata budget.
    #[cfg(test)]
    pub fn metadata_bytes(&self) -> usize {
        self.state.capacity() * size_of::<PageState>() + self.fifo.capacity() * size_of::<u32>()
    }

    pub fn get(&self, page: u32) -> PageState {
        self.state[page as usize]
    }

    pub fn resident(&self) -> usize {
        self.fifo.len()
    }

    /// `page` was mapped, write-protected if `Clean`: it joins the queue's tail.
    pub fn map(&mut self, page: u32, now: PageState) {
        debug_assert!(!self.get(page).is_resident());
        debug_assert!(now.is_resident());
        self.state[page as usize] = now;
        self.fifo.push_back(page);
    }

    /// A victim that stayed mapped rejoins the queue's tail, as it was.
    pub fn requeue(&mut self, page: u32) {
        debug_assert!(self.get(page).is_resident());
        self.fifo.push_back(page);
    }

    /// A resident page was (or may have been) written to: its store copy is
    /// stale from now on.
    pub fn dirtied(&mut self, page: u32) {
        debug_assert!(self.get(page).is_resident());
        self.state[page as usize] = PageState::Dirty;
    }

    /// Undo the latest [`PageTable::map`], of `page`, which was `was` before.
    pub fn unmap_newest(&mut self, page: u32, was: PageState) {
        debug_assert_eq!(self.fifo.back(), Some(&page));
        self.fifo.pop_back();
        self.state[page as usize] = was;
    }

    /// Take up to `count` of the oldest resident pages as eviction victims.
    /// They leave the queue but keep their `Clean`/`Dirty` state until the
    /// caller settles each one with [`PageTable::evicted`],
    /// [`PageTable::emptied`] or [`PageTable::requeue`].
    pub fn take_victims(&mut self, count: usize, out: &mut Vec<u32>) {
        out.clear();
        let n = count.min(self.fifo.len());
        out.extend(self.fifo.drain(..n));
    }

    /// A victim's bytes are now in the store.
    pub fn evicted(&mut self, page: u32) {
        self.state[page as usize] = PageState::InStore;
    }

    /// A victim had no page to move (dropped behind our back): it reads as
    /// zero next time, as MADV_DONTNEED promises.
    pub fn emptied(&mut self, page: u32) {
        self.state[page as usize] = PageState::Empty;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_fits_in_16_bytes_per_page() {
        assert_eq!(size_of::<PageState>(), 1);
        let pages = 4096;
        let mut table = PageTable::new(pages);
        for page in 0..pages {
            table.map(page, PageState::Dirty);
        }
        let per_page = table.metadata_bytes() / pages as usize;
        assert!(per_page <= 16, "{per_page} bytes per page");
        assert!(per_page <= 2 * METADATA_BYTES_PER_PAGE, "{per_page} bytes per page");
    }

    #[test]
    fn victims_leave_in_fault_in_order() {
        let mut table = PageTable::new(8);
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
        let mut table = PageTable::new(4);
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
}
