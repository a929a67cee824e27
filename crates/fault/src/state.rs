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
/// The page has an entry in an eviction queue. Every resident page has
/// one; a page discarded while resident keeps its (now stale) entry, which
/// eviction skips, or which the page reuses if it is mapped again first. So
/// no page ever has two entries.
const QUEUED: u8 = 1 << 2;
/// Its entry is in the main queue, not the small one.
const MAIN: u8 = 1 << 3;
/// Used since it was queued (a WP fault on it while `Clean`): promoted out
/// of small, or given a second round in main, instead of being evicted.
const HOT: u8 = 1 << 4;
/// Evicted recently (it is in the ghost ring): if it faults back it was
/// evicted too early, and it goes straight to main.
const GHOST: u8 = 1 << 5;
/// Mapped by prefetch and not yet known to be used: cleared when a write
/// faults on it or the faulting stream moves past it (a use), or when it is
/// evicted (wasted).
const PREFETCHED: u8 = 1 << 6;
/// Came back into main after main evicted it (a fault on its ghost): main
/// gives it one more round at its head, once per return. Reads of mapped
/// pages are invisible, so coming back is the one sign of a page used
/// often.
const BACK: u8 = 1 << 7;

/// The ghost ring holds a quarter of the budget's ids: blind to reads, only
/// a page that returns soon is worth a place in main. With BACK, replayed
/// on redis and SQLite traces, 1-14% fewer misses than a ring of the whole
/// budget (fault/DESIGN.md, "Blind to reads").
const GHOSTS_PER_BUDGET_DIV: usize = 4;

const _: () = assert!(METADATA_BYTES_PER_PAGE <= 16);

/// Bytes of bookkeeping per page at most, when the budget is the whole
/// region: the state byte, a 4-byte queue entry while the page is resident,
/// and a 4-byte ghost entry (the ring holds at most `budget_pages`). With a
/// budget of a quarter of the region it is 1 + 2 = 3 bytes per page.
pub const METADATA_BYTES_PER_PAGE: usize = 1 + 2 * size_of::<u32>();

/// How victims are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Oldest fault-in first.
    Fifo,
    /// S3-FIFO (Yang et al., SOSP 2023), with the only signals userfaultfd
    /// gives: new pages enter a small FIFO (a tenth of the budget); a page
    /// used there (a WP fault on it) moves to the main FIFO when it reaches
    /// the head, an unused one is evicted and remembered in a ghost ring of
    /// a quarter of `budget_pages` ids. A fault on a ghost page puts it
    /// straight into main. Main evicts in FIFO order, but a page used since
    /// it was queued, or back after main evicted it, gets one more round.
    #[default]
    S3Fifo,
}

/// Page states plus the resident pages in eviction order.
pub struct PageTable {
    bits: Vec<u8>,
    policy: Policy,
    small: VecDeque<u32>,
    main: VecDeque<u32>,
    ghosts: VecDeque<u32>,
    /// Live (resident) entries in `small` and `main`; the rest are stale.
    small_live: usize,
    main_live: usize,
    /// Evict from small while it holds at least this many live pages.
    small_target: usize,
    ghost_limit: usize,
    /// Stale entries allowed in the queues before they are compacted.
    stale_limit: usize,
    /// Pages not `Empty`: the region's footprint, resident or not.
    held: usize,
}

impl PageTable {
    pub fn new(pages: u32, budget_pages: usize, policy: Policy) -> PageTable {
        PageTable {
            bits: vec![PageState::Empty as u8; pages as usize],
            policy,
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghosts: VecDeque::new(),
            small_live: 0,
            main_live: 0,
            small_target: (budget_pages / 10).max(1),
            ghost_limit: (budget_pages / GHOSTS_PER_BUDGET_DIV).max(1),
            stale_limit: (budget_pages / 4).max(64),
            held: 0,
        }
    }

    /// Heap bytes held, for the metadata budget.
    #[cfg(test)]
    pub fn metadata_bytes(&self) -> usize {
        let entries = self.small.capacity() + self.main.capacity() + self.ghosts.capacity();
        self.bits.capacity() + entries * size_of::<u32>()
    }

    pub fn get(&self, page: u32) -> PageState {
        PageState::from_bits(self.bits[page as usize])
    }

    /// Pages mapped now, not counting victims being evicted.
    pub fn resident(&self) -> usize {
        self.small_live + self.main_live
    }

    /// Pages with contents (not `Empty`), mapped, being evicted or in the
    /// store: when this fits the budget, every page can stay mapped.
    pub fn held(&self) -> usize {
        self.held
    }

    fn set(&mut self, page: u32, now: PageState) {
        let byte = &mut self.bits[page as usize];
        let was = PageState::from_bits(*byte);
        *byte = (*byte & !STATE_MASK) | now as u8;
        // Branches, not `+= usize::from(..)`: see `fork/page_bits.rs` (a rustc
        // 1.95 miscompile of a bool added to a field).
        if now != PageState::Empty {
            self.held += 1;
        }
        if was != PageState::Empty {
            self.held -= 1;
        }
    }

    fn flag(&self, page: u32, flag: u8) -> bool {
        self.bits[page as usize] & flag != 0
    }

    fn set_flag(&mut self, page: u32, flag: u8, on: bool) {
        let byte = &mut self.bits[page as usize];
        *byte = if on { *byte | flag } else { *byte & !flag };
    }

    fn live(&mut self, page: u32) -> &mut usize {
        if self.flag(page, MAIN) {
            &mut self.main_live
        } else {
            &mut self.small_live
        }
    }

    /// `page` was mapped, write-protected if `Clean`. A ghost goes to main,
    /// anything else to small (under FIFO, everything to main). A page
    /// with a stale entry takes it back wherever it is; a ghost whose stale
    /// entry is in small is marked used, so it moves on to main. Returns
    /// whether it was a ghost.
    pub fn map(&mut self, page: u32, now: PageState) -> bool {
        debug_assert!(!self.get(page).is_resident());
        debug_assert!(now.is_resident());
        self.set(page, now);
        let ghost = self.flag(page, GHOST);
        self.set_flag(page, GHOST, false);
        // MAIN outlives the entry: it says where the page was evicted from.
        let back = ghost && self.flag(page, MAIN) && !self.flag(page, QUEUED);
        self.set_flag(page, BACK, back);
        if self.flag(page, QUEUED) {
            if ghost && !self.flag(page, MAIN) {
                self.set_flag(page, HOT, true);
            }
        } else {
            self.set_flag(page, HOT, false);
            let to_main = ghost || self.policy == Policy::Fifo;
            self.push(page, to_main);
        }
        *self.live(page) += 1;
        ghost
    }

    fn push(&mut self, page: u32, to_main: bool) {
        self.set_flag(page, QUEUED, true);
        self.set_flag(page, MAIN, to_main);
        if to_main {
            self.main.push_back(page);
        } else {
            self.small.push_back(page);
        }
    }

    /// A victim that stayed mapped rejoins the tail of main, as it was.
    pub fn requeue(&mut self, page: u32) {
        debug_assert!(self.get(page).is_resident());
        self.push(page, true);
        self.main_live += 1;
    }

    /// A resident page may have been written to: its store copy is stale
    /// from now on.
    pub fn dirtied(&mut self, page: u32) {
        debug_assert!(self.get(page).is_resident());
        self.set(page, PageState::Dirty);
    }

    /// A resident `Dirty` page was written to the store and protected
    /// again: its store copy is current.
    pub fn cleaned(&mut self, page: u32) {
        debug_assert_eq!(self.get(page), PageState::Dirty);
        self.set(page, PageState::Clean);
    }

    /// A write faulted on a resident `Clean` page: dirty, and a use.
    /// Returns whether it was an unused prefetched page.
    pub fn written(&mut self, page: u32) -> bool {
        self.dirtied(page);
        if self.policy == Policy::S3Fifo {
            self.set_flag(page, HOT, true);
        }
        self.take_prefetched(page)
    }

    /// `page` was just mapped by prefetch (`Clean`, or `Dirty` if mapped
    /// writable), not by a fault.
    pub fn map_prefetched(&mut self, page: u32, now: PageState) {
        self.map(page, now);
        self.set_flag(page, PREFETCHED, true);
    }

    /// Whether `page` is a prefetched page not yet counted as used; it
    /// counts as used from now on.
    pub fn take_prefetched(&mut self, page: u32) -> bool {
        let was = self.flag(page, PREFETCHED);
        self.set_flag(page, PREFETCHED, false);
        was
    }

    /// Undo the latest [`PageTable::map`], of `page`, which was `was` before.
    /// Its queue entry stays, stale, for the page to reuse.
    pub fn unmap_newest(&mut self, page: u32, was: PageState) {
        debug_assert!(self.get(page).is_resident());
        *self.live(page) -= 1;
        self.set(page, was);
    }

    /// Take up to `count` victims. They leave the queues and the resident
    /// count (and join the ghosts) but keep their `Clean`/`Dirty` state
    /// until the caller settles each one with [`PageTable::evicted`],
    /// [`PageTable::emptied`] or [`PageTable::requeue`]. Returns how many
    /// were prefetched pages never used.
    pub fn take_victims(&mut self, count: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        let mut unused_prefetches = 0;
        // Each pop either yields a victim, drops a stale entry, or moves a
        // used page on (clearing its mark), so this many pops always suffice.
        let mut pops = 2 * (self.small.len() + self.main.len()) + count;
        while out.len() < count && pops > 0 && self.resident() > 0 {
            pops -= 1;
            if let Some(page) = self.pop_one() {
                self.remember(page);
                unused_prefetches += usize::from(self.take_prefetched(page));
                out.push(page);
            }
        }
        unused_prefetches
    }

    /// `take_victims`, but `Clean` pages only: the others met on the way
    /// keep their places at the heads of their queues. A fork's pause makes
    /// room this way without writing anything (`handler/mod.rs`).
    pub fn take_clean_victims(&mut self, count: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        let mut unused_prefetches = 0;
        let mut passed = Vec::new();
        // As in `take_victims`; a page passed over is one more pop.
        let mut pops = 2 * (self.small.len() + self.main.len()) + count;
        // (A page passed over is out of the live counts until it goes back.)
        while out.len() < count && pops > 0 && self.resident() > 0 {
            pops -= 1;
            let Some(page) = self.pop_one() else { continue };
            if self.get(page) != PageState::Clean {
                passed.push(page);
                continue;
            }
            self.remember(page);
            if self.take_prefetched(page) {
                unused_prefetches += 1;
            }
            out.push(page);
        }
        // Back at the heads, in the order they were met.
        for &page in passed.iter().rev() {
            self.set_flag(page, QUEUED, true);
            if self.flag(page, MAIN) {
                self.main.push_front(page);
            } else {
                self.small.push_front(page);
            }
            *self.live(page) += 1;
        }
        unused_prefetches
    }

    /// One step of eviction: a victim, or None if the popped entry was
    /// stale or got another chance.
    fn pop_one(&mut self) -> Option<u32> {
        let from_small = self.small_live >= self.small_target || self.main_live == 0;
        let page = if from_small { self.small.pop_front() } else { self.main.pop_front() }?;
        self.set_flag(page, QUEUED, false);
        if !self.get(page).is_resident() {
            return None;
        }
        *self.live(page) -= 1;
        let back = self.flag(page, MAIN) && self.flag(page, BACK);
        if self.flag(page, HOT) || back {
            // A round for a use first; the one for coming back is kept.
            if !self.flag(page, HOT) {
                self.set_flag(page, BACK, false);
            }
            self.set_flag(page, HOT, false);
            self.push(page, true);
            self.main_live += 1;
            return None;
        }
        Some(page)
    }

    fn remember(&mut self, page: u32) {
        if self.policy == Policy::Fifo {
            return;
        }
        if self.ghosts.len() >= self.ghost_limit {
            // The oldest ghost may be a page evicted twice since; then it
            // forgets its newer visit a little early, which is harmless.
            if let Some(old) = self.ghosts.pop_front() {
                self.set_flag(old, GHOST, false);
            }
        }
        self.set_flag(page, GHOST, true);
        self.ghosts.push_back(page);
    }

    /// A victim taken from main rather than from the probation queue: it
    /// came back after an eviction (or, blind to reads, was written while
    /// mapped), so it is one that is used again. Valid until the victim is
    /// settled.
    pub fn victim_from_main(&self, page: u32) -> bool {
        self.flag(page, MAIN)
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
    /// of the resident count and the ghosts, and any store copy is garbage.
    /// Its queue entry, if any, goes stale; the queues are compacted once
    /// too many are.
    pub fn forget(&mut self, page: u32) {
        if self.get(page).is_resident() {
            *self.live(page) -= 1;
        }
        self.set(page, PageState::Empty);
        self.set_flag(page, GHOST, false);
        self.set_flag(page, PREFETCHED, false);
        self.set_flag(page, BACK, false);
    }

    /// Drop stale entries once they are more than `stale_limit`: this keeps
    /// the queues within `resident + stale_limit` entries however often the
    /// owner discards pages that are never evicted. Linear in the queues,
    /// so run it after a whole discarded range, not per page.
    pub fn compact_if_stale(&mut self) {
        if self.small.len() + self.main.len() <= self.resident() + self.stale_limit {
            return;
        }
        let small = std::mem::take(&mut self.small);
        self.small = self.compacted(small);
        let main = std::mem::take(&mut self.main);
        self.main = self.compacted(main);
    }
}

impl PageTable {
    fn compacted(&mut self, mut queue: VecDeque<u32>) -> VecDeque<u32> {
        queue.retain(|&page| {
            let live = self.get(page).is_resident();
            if !live {
                self.set_flag(page, QUEUED, false);
            }
            live
        });
        queue.shrink_to(queue.len() + self.stale_limit);
        queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_fits_in_16_bytes_per_page() {
        let pages = 4096;
        let mut table = PageTable::new(pages, pages as usize, Policy::S3Fifo);
        for page in 0..pages {
            table.map(page, PageState::Dirty);
        }
        let per_page = table.metadata_bytes() / pages as usize;
        assert!(per_page <= 16, "{per_page} bytes per page");
        assert!(per_page <= 2 * METADATA_BYTES_PER_PAGE, "{per_page} bytes per page");
    }

    #[test]
    fn victims_leave_in_fault_in_order() {
        let mut table = PageTable::new(8, 8, Policy::Fifo);
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
    fn clean_victims_pass_dirty_pages_which_keep_their_places() {
        let mut table = PageTable::new(8, 8, Policy::Fifo);
        for page in [5, 1, 7, 2, 3] {
            table.map(page, PageState::Dirty);
        }
        [1, 2].iter().for_each(|&page| table.cleaned(page));
        let mut victims = Vec::new();
        table.take_clean_victims(8, &mut victims);
        assert_eq!(victims, [1, 2], "only the clean ones");
        assert_eq!(table.resident(), 3);
        table.take_victims(8, &mut victims);
        assert_eq!(victims, [5, 7, 3], "the dirty ones still oldest first");
    }

    #[test]
    fn held_counts_pages_with_contents_wherever_they_are() {
        let mut table = PageTable::new(8, 2, Policy::S3Fifo);
        for page in [0, 1, 2] {
            table.map(page, PageState::Dirty);
        }
        let mut victims = Vec::new();
        table.take_victims(1, &mut victims);
        assert_eq!((table.resident(), table.held()), (2, 3), "a victim in flight is held");
        table.evicted(victims[0]);
        assert_eq!(table.held(), 3, "a page in the store is held");
        table.map(victims[0], PageState::Clean);
        table.forget(1);
        table.forget(5);
        assert_eq!(table.held(), 2, "forgotten and never-touched pages are not");
        table.take_victims(1, &mut victims);
        table.emptied(victims[0]);
        assert_eq!(table.held(), 1);
    }

    #[test]
    fn the_dirty_bit_survives_victim_selection() {
        let mut table = PageTable::new(4, 4, Policy::Fifo);
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
        let mut table = PageTable::new(8, 8, Policy::Fifo);
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
        let mut table = PageTable::new(1024, 16, Policy::S3Fifo);
        for round in 0..100 {
            for page in 0..512 {
                table.map(page, PageState::Dirty);
            }
            for page in 0..512 {
                table.forget(page);
            }
            table.compact_if_stale();
            let entries = table.small.len() + table.main.len();
            assert!(entries <= 64, "round {round}: {entries}");
        }
        // The queue grows only with pages actually mapped: 512 each round,
        // never the 51 200 mapped over all rounds.
        let capacity = table.small.capacity() + table.main.capacity();
        assert!(capacity <= 1024, "{capacity}");
    }
}
