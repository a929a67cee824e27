//! The fault handler's own `PageTable` (FIFO and S3-FIFO), replayed with
//! the signals it gets live, or with every access.

use crate::Cache;
use memlend_fault::{PageState, PageTable, Policy};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Fifo,
    /// Hits count only when the handler would see them: a write to a page
    /// mapped write-protected (`Clean`).
    S3FifoBlind,
    /// Every hit counts, as if reads of mapped pages were seen.
    S3FifoSighted,
}

pub(crate) struct Table {
    table: PageTable,
    kind: Kind,
    cache_pages: usize,
    victims: Vec<u32>,
}

impl Table {
    pub(crate) fn new(ids: usize, cache_pages: usize, kind: Kind) -> Table {
        let policy = if kind == Kind::Fifo { Policy::Fifo } else { Policy::S3Fifo };
        let pages = u32::try_from(ids).expect("ids fit a region");
        Table {
            table: PageTable::new(pages, cache_pages, policy),
            kind,
            cache_pages,
            victims: Vec::new(),
        }
    }
}

impl Cache for Table {
    fn access(&mut self, id: u32, write: bool) -> bool {
        let state = self.table.get(id);
        if state.is_resident() {
            let seen = match self.kind {
                Kind::Fifo => false,
                Kind::S3FifoBlind => write && state == PageState::Clean,
                Kind::S3FifoSighted => true,
            };
            if seen {
                self.table.written(id);
            }
            return true;
        }
        if self.table.resident() >= self.cache_pages {
            self.table.take_victims(1, &mut self.victims);
            for &victim in &self.victims {
                self.table.evicted(victim);
            }
        }
        let now = if write { PageState::Dirty } else { PageState::Clean };
        self.table.map(id, now);
        false
    }
}
