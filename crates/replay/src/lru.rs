//! Least recently used: sees every access; the classic reference.

use crate::lists::Lists;
use crate::Cache;

pub(crate) struct Lru {
    lists: Lists<1>,
    cache_pages: usize,
}

impl Lru {
    pub(crate) fn new(ids: usize, cache_pages: usize) -> Lru {
        Lru { lists: Lists::new(ids), cache_pages }
    }
}

impl Cache for Lru {
    fn access(&mut self, id: u32, _write: bool) -> bool {
        let hit = self.lists.list_of(id).is_some();
        if !hit && self.lists.len(0) == self.cache_pages {
            self.lists.pop_back(0);
        }
        self.lists.move_to_front(0, id);
        hit
    }
}
