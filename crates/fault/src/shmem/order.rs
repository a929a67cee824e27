//! The order in which a segment's resident pages leave: oldest first, with
//! a second turn for a page that came back from the store since it last
//! went. Victims are sorted, so that neighbours among them form runs
//! (each run costs a write-protect and its release in every process that
//! maps the segment). Taking a victim's old neighbours along as well (those
//! in the older half) makes runs longer; on PostgreSQL's TPC-B-like mix
//! three runs could not tell the two apart (docs/notebook/2026-11-29-shared-memory.md),
//! and the simpler order stays.

use super::bits::Bits;
use std::collections::VecDeque;

pub(crate) struct Order {
    /// (page, stamp) in the order they came in; an entry whose page has
    /// since left (or come in again, with a newer stamp) is stale.
    queue: VecDeque<(u32, u32)>,
    /// Each resident page's stamp; 0: not resident.
    stamp: Vec<u32>,
    again: Bits,
    next: u32,
    resident: u32,
}

impl Order {
    pub(crate) fn new(pages: u32) -> Order {
        Order {
            queue: VecDeque::new(),
            stamp: vec![0; pages as usize],
            again: Bits::new(pages),
            next: 1,
            resident: 0,
        }
    }

    pub(crate) fn resident(&self) -> u32 {
        self.resident
    }

    /// `page` came in; `came_back`: from the store, after an eviction.
    pub(crate) fn placed(&mut self, page: u32, came_back: bool) {
        if self.stamp[page as usize] == 0 {
            self.resident += 1;
        }
        self.again.set(page, came_back);
        self.stamp(page);
    }

    fn stamp(&mut self, page: u32) {
        // Stamps wrap after 4 G placements: a wrapped page only looks young.
        self.next = self.next.wrapping_add(1).max(1);
        self.stamp[page as usize] = self.next;
        self.queue.push_back((page, self.next));
    }

    /// Up to `want` victims, sorted, no longer resident here (give them
    /// back with [`Order::put_back`] if they cannot go).
    pub(crate) fn victims(&mut self, want: usize) -> Vec<u32> {
        let mut victims = Vec::with_capacity(want);
        // Each entry is looked at once; a second chance re-queues it once.
        let mut looks = 2 * self.queue.len();
        while victims.len() < want && looks > 0 {
            let Some((page, stamp)) = self.queue.pop_front() else { break };
            looks -= 1;
            if self.stamp[page as usize] != stamp {
                continue; // stale
            }
            if self.again.get(page) {
                self.again.set(page, false);
                self.stamp(page);
                continue;
            }
            self.take(page, &mut victims);
        }
        victims.sort_unstable();
        victims
    }

    fn take(&mut self, page: u32, victims: &mut Vec<u32>) {
        self.stamp[page as usize] = 0;
        self.resident -= 1;
        victims.push(page);
    }

    /// Victims that could not go: resident again, as the youngest.
    pub(crate) fn put_back(&mut self, pages: &[u32]) {
        for &page in pages {
            self.placed(page, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_sorted() {
        let mut o = Order::new(256);
        for p in [10, 200, 11, 12, 100, 13] {
            o.placed(p, false);
        }
        assert_eq!(o.victims(3), vec![10, 11, 200]);
        assert_eq!(o.resident(), 3);
        o.placed(10, false); // in again: the youngest
        assert_eq!(o.victims(3), vec![12, 13, 100]);
        assert_eq!(o.victims(8), vec![10]);
        assert_eq!(o.resident(), 0);
    }

    #[test]
    fn a_page_back_from_the_store_gets_a_second_turn() {
        let mut o = Order::new(64);
        o.placed(1, true);
        o.placed(40, false);
        assert_eq!(o.victims(1), vec![40]);
        assert_eq!(o.victims(1), vec![1]);
    }

    #[test]
    fn victims_put_back_are_resident_and_youngest() {
        let mut o = Order::new(64);
        o.placed(1, false);
        o.placed(50, false);
        let v = o.victims(1);
        assert_eq!(v, vec![1]);
        o.put_back(&v);
        assert_eq!(o.resident(), 2);
        assert_eq!(o.victims(1), vec![50]);
    }
}
