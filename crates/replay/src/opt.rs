//! Belady's MIN: evict the page used again furthest in the future. It needs
//! the whole trace, so it is the bound, not a policy anyone can run.

use crate::Cache;
use std::collections::BinaryHeap;

const NEVER: usize = usize::MAX;

pub(crate) struct Opt {
    /// For trace position i, the position of the next use of its page.
    next_use: Vec<usize>,
    /// Next use of each cached id: its one live heap entry.
    due: Vec<usize>,
    cached: Vec<bool>,
    /// (next use, id), latest entry per id live, older ones skipped.
    heap: BinaryHeap<(usize, u32)>,
    used: usize,
    cache_pages: usize,
    /// Position in the trace: `access` must be called in trace order.
    at: usize,
}

impl Opt {
    pub(crate) fn new(trace: &[(u32, bool)], ids: usize, cache_pages: usize) -> Opt {
        let mut next_use = vec![NEVER; trace.len()];
        let mut seen = vec![NEVER; ids];
        for (i, &(id, _)) in trace.iter().enumerate().rev() {
            next_use[i] = seen[id as usize];
            seen[id as usize] = i;
        }
        Opt {
            next_use,
            due: vec![NEVER; ids],
            cached: vec![false; ids],
            heap: BinaryHeap::with_capacity(cache_pages * 2),
            used: 0,
            cache_pages,
            at: 0,
        }
    }

    fn evict(&mut self) {
        while let Some((due, id)) = self.heap.pop() {
            if self.cached[id as usize] && self.due[id as usize] == due {
                self.cached[id as usize] = false;
                self.used -= 1;
                return;
            }
        }
        unreachable!("a full cache has a live heap entry");
    }
}

impl Cache for Opt {
    fn access(&mut self, id: u32, _write: bool) -> bool {
        let due = self.next_use[self.at];
        self.at += 1;
        let hit = self.cached[id as usize];
        if !hit {
            if self.used == self.cache_pages {
                self.evict();
            }
            self.cached[id as usize] = true;
            self.used += 1;
        }
        self.due[id as usize] = due;
        self.heap.push((due, id));
        if self.heap.len() > 4 * self.cache_pages + 1024 {
            self.compact();
        }
        hit
    }
}

impl Opt {
    /// Drop dead entries, so the heap stays within a few times the cache.
    fn compact(&mut self) {
        let (due, cached) = (&self.due, &self.cached);
        self.heap.retain(|&(d, id)| cached[id as usize] && due[id as usize] == d);
    }
}
