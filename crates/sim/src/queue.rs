//! The event queue: ordered by (time, sequence number), so two events at the
//! same microsecond always run in the order they were scheduled and a run is
//! the same byte for byte for a seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Most events queued. Datagrams in flight are what fills it: at this bound
/// a new datagram is dropped and counted (`full_drops`), as a switch with a
/// full buffer would. Timers are few (at most a handful per node) and are
/// always admitted, up to `EVENTS_MAX + timer_headroom`; past that it is a
/// bug and the run panics.
pub const EVENTS_MAX: usize = 1 << 22;

struct Entry<T> {
    at_us: u64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.at_us, self.seq) == (o.at_us, o.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    /// Reversed: `BinaryHeap` is a max-heap, we want the earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at_us, o.seq).cmp(&(self.at_us, self.seq))
    }
}

pub struct Queue<T> {
    heap: BinaryHeap<Entry<T>>,
    seq: u64,
    timer_headroom: usize,
    pub full_drops: u64,
    /// The most events queued at once in this run.
    pub peak_len: usize,
}

impl<T> Queue<T> {
    /// `timer_headroom`: how many timers may exceed `EVENTS_MAX` (a few per
    /// node).
    pub fn new(timer_headroom: usize) -> Queue<T> {
        Queue { heap: BinaryHeap::new(), seq: 0, timer_headroom, full_drops: 0, peak_len: 0 }
    }

    /// A datagram: false (and counted) when the queue is full.
    pub fn push_datagram(&mut self, at_us: u64, item: T) -> bool {
        if self.heap.len() >= EVENTS_MAX {
            self.full_drops += 1;
            return false;
        }
        self.push(at_us, item);
        true
    }

    pub fn push_timer(&mut self, at_us: u64, item: T) {
        assert!(
            self.heap.len() < EVENTS_MAX + self.timer_headroom,
            "event queue holds {} events: timers are leaking (a bug)",
            self.heap.len()
        );
        self.push(at_us, item);
    }

    fn push(&mut self, at_us: u64, item: T) {
        self.seq += 1;
        self.heap.push(Entry { at_us, seq: self.seq, item });
        self.peak_len = self.peak_len.max(self.heap.len());
    }

    pub fn pop(&mut self) -> Option<(u64, T)> {
        self.heap.pop().map(|e| (e.at_us, e.item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_fifo() {
        let mut q = Queue::new(0);
        q.push_timer(5, "c");
        q.push_timer(1, "a");
        q.push_timer(5, "d");
        q.push_timer(1, "b");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, x)| x)).collect();
        assert_eq!(order, ["a", "b", "c", "d"]);
    }
}
