//! Per-page state, owned by the handler thread alone (so it needs no atomics).
//!
//! ```text
//!   Empty ──fault: zero-fill──▶ Resident ──evict: move out, write──▶ InStore
//!                                  ▲                                   │
//!                                  └──────fault: read, UFFDIO_COPY─────┘
//! ```
//! A page leaves `Resident` only through eviction. A page that is `InStore`
//! stays there until it is faulted back in; the store's copy is stale from
//! then on and is overwritten at the next eviction.

use std::collections::VecDeque;

/// One byte per page.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// Never written out: a fault zero-fills it with no store I/O.
    Empty,
    /// Mapped in the region.
    Resident,
    /// Not mapped; its bytes are in the store.
    InStore,
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

    /// `page` was mapped: it joins the queue's tail.
    pub fn map(&mut self, page: u32) {
        debug_assert_ne!(self.get(page), PageState::Resident);
        self.state[page as usize] = PageState::Resident;
        self.fifo.push_back(page);
    }

    /// Undo the latest [`PageTable::map`], of `page`, which was `was` before.
    pub fn unmap_newest(&mut self, page: u32, was: PageState) {
        debug_assert_eq!(self.fifo.back(), Some(&page));
        self.fifo.pop_back();
        self.state[page as usize] = was;
    }

    /// Take up to `count` of the oldest resident pages as eviction victims.
    /// They stay `Resident` until the caller settles each one with
    /// [`PageTable::evicted`] or [`PageTable::map`].
    pub fn take_victims(&mut self, count: usize, out: &mut Vec<u32>) {
        out.clear();
        let n = count.min(self.fifo.len());
        out.extend(self.fifo.drain(..n));
        for &page in out.iter() {
            // Back to a non-resident state until settled, so `map` can requeue.
            self.state[page as usize] = PageState::Empty;
        }
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
            table.map(page);
        }
        let per_page = table.metadata_bytes() / pages as usize;
        assert!(per_page <= 16, "{per_page} bytes per page");
        assert!(per_page <= 2 * METADATA_BYTES_PER_PAGE, "{per_page} bytes per page");
    }

    #[test]
    fn victims_leave_in_fault_in_order() {
        let mut table = PageTable::new(8);
        for page in [5, 1, 7] {
            table.map(page);
        }
        let mut victims = Vec::new();
        table.take_victims(2, &mut victims);
        assert_eq!(victims, [5, 1]);
        assert_eq!(table.resident(), 1);
        table.evicted(5);
        table.map(1);
        assert_eq!(table.get(5), PageState::InStore);
        assert_eq!(table.get(1), PageState::Resident);
        table.take_victims(8, &mut victims);
        assert_eq!(victims, [7, 1]);
    }
}
