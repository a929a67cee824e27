//! The handler's part in a fork (`Region::pause`): everything settled, room
//! made for the child, the pages listed, and held still until the owner
//! has forked. What the fork leaves to do after it is `fork::Forks`.

use super::Handler;
use crate::stats::Counters;
use std::time::Instant;

impl Handler {
    /// A fork is coming: finish every write-back and fetch, so that each
    /// page is either mapped or wholly in the store; if the pages do not
    /// all fit the budget, write the dirty ones to the store
    /// (`fork/clean.rs`); list the pages whose bytes the store holds
    /// (`InStore` and `Clean`), which the child need not share; and wait
    /// until the owner has forked. Then, if the budget was lowered, evict
    /// down to it (the victims are clean now: dropped with no write).
    ///
    /// A lazy pause (`Region::pause_lazy`) evicts first and then, instead
    /// of writing the dirty pages, write-protects them and lists them as
    /// pending: they are written after the fork (`fork/lazy.rs`).
    pub(super) fn park_for_fork(&mut self) {
        use crate::fork::pause::PauseStep;
        use crate::state::PageState::{Clean, InStore};
        let started = std::time::Instant::now();
        self.pause.at(PauseStep::Fetches);
        self.ahead.finish_all_fetches(&mut self.core, &mut self.eviction, &mut self.fork);
        self.pause.at(PauseStep::WriteBacks);
        self.eviction.settle_all(&mut self.core);
        self.pause.at(PauseStep::Cleaning);
        // The last fork's pending pages are its child's: written first.
        self.fork.write_all(&mut self.core);
        let lazy = self.pause.is_lazy();
        let pending = if self.core.table.held() > self.core.budget_pages {
            self.room_for_fork(lazy)
        } else {
            vec![0u64; (self.core.pages as usize).div_ceil(64)]
        };
        self.pause.at(PauseStep::Listing);
        let pages = self.core.pages;
        let mut in_store = vec![0u64; (pages as usize).div_ceil(64)];
        for page in 0..pages {
            if matches!(self.core.table.get(page), InStore | Clean) {
                in_store[page as usize / 64] |= 1 << (page % 64);
            }
        }
        Counters::add(&self.core.counters.forks, 1);
        let took_ns = started.elapsed().as_nanos() as u64;
        Counters::add(&self.core.counters.fork_pause_ns, took_ns);
        self.pause.park(crate::fork::pause::Parked { in_store, pending: pending.clone() });
        self.fork.forked(&self.core.table, pages, pending, self.pause.take_sink());
    }

    /// The pause of a region whose pages do not all fit: write the dirty
    /// pages (eager), evict down to the budget the owner lowered for the
    /// child (`--mem`), and for a lazy pause protect the dirty pages and
    /// return them as pending (else none). Each part is timed.
    fn room_for_fork(&mut self, lazy: bool) -> Vec<u64> {
        debug_assert!(!self.eviction.writer.any_busy(), "write-backs settle before the clean");
        let c = std::sync::Arc::clone(&self.core.counters);
        let since_ns = |t: Instant| t.elapsed().as_nanos() as u64;
        let writing = Instant::now();
        if !lazy {
            crate::fork::clean::clean_for_fork(&mut self.core);
            Counters::add(&c.fork_pause_dirty_ns, since_ns(writing));
        }
        self.pause.at(crate::fork::pause::PauseStep::Evicting);
        let evicting = Instant::now();
        self.follow_budget();
        if lazy {
            // The room from `Clean` pages first: they go with no write, so
            // the fork waits less. The dirty ones are written after it.
            self.eviction.clean_only = true;
            self.eviction.evict_down_to_budget(&mut self.core, &mut self.fork);
            self.eviction.clean_only = false;
        }
        self.eviction.evict_down_to_budget(&mut self.core, &mut self.fork);
        Counters::add(&c.fork_pause_evict_ns, since_ns(evicting));
        if !lazy {
            return vec![0u64; (self.core.pages as usize).div_ceil(64)];
        }
        let protecting = Instant::now();
        let pending = crate::fork::lazy::protect_dirty(&self.core);
        Counters::add(&c.fork_pause_dirty_ns, since_ns(protecting));
        pending
    }
}
