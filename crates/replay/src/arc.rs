//! ARC (Megiddo and Modha, FAST 2003): a recency list T1 and a frequency
//! list T2 share the cache; ghost lists B1 and B2 remember what each
//! evicted, and a hit in a ghost list moves the split `p` toward the list
//! that would have kept it. Sees every access.

use crate::lists::Lists;
use crate::Cache;

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

pub(crate) struct Arc {
    lists: Lists<4>,
    c: usize,
    /// Target size of T1.
    p: usize,
}

impl Arc {
    pub(crate) fn new(ids: usize, cache_pages: usize) -> Arc {
        Arc { lists: Lists::new(ids), c: cache_pages, p: 0 }
    }

    fn len(&self, list: usize) -> usize {
        self.lists.len(list)
    }

    /// Make room in the cache: T1's or T2's least recent page becomes a ghost.
    fn replace(&mut self, in_b2: bool) {
        if self.len(T1) + self.len(T2) < self.c {
            return;
        }
        let t1 = self.len(T1);
        let from_t1 = t1 > 0 && (t1 > self.p || (in_b2 && t1 == self.p));
        let (from, to) = if from_t1 { (T1, B1) } else { (T2, B2) };
        if let Some(victim) = self.lists.pop_back(from) {
            self.lists.push_front(to, victim);
        }
    }
}

impl Cache for Arc {
    fn access(&mut self, id: u32, _write: bool) -> bool {
        match self.lists.list_of(id) {
            Some(T1) | Some(T2) => {
                self.lists.move_to_front(T2, id);
                true
            }
            Some(B1) => {
                let step = (self.len(B2) / self.len(B1)).max(1);
                self.p = (self.p + step).min(self.c);
                self.replace(false);
                self.lists.move_to_front(T2, id);
                false
            }
            Some(_) => {
                let step = (self.len(B1) / self.len(B2)).max(1);
                self.p = self.p.saturating_sub(step);
                self.replace(true);
                self.lists.move_to_front(T2, id);
                false
            }
            None => {
                let l1 = self.len(T1) + self.len(B1);
                if l1 == self.c {
                    if self.len(T1) < self.c {
                        self.lists.pop_back(B1);
                        self.replace(false);
                    } else {
                        self.lists.pop_back(T1);
                    }
                } else {
                    let total = l1 + self.len(T2) + self.len(B2);
                    if total >= self.c {
                        if total == 2 * self.c {
                            self.lists.pop_back(B2);
                        }
                        self.replace(false);
                    }
                }
                self.lists.push_front(T1, id);
                false
            }
        }
    }
}
