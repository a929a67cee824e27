//! Doubly linked lists threaded through arrays indexed by dense page id, so
//! that LRU and ARC move a page in O(1) with no allocation per access.

const NIL: u32 = u32::MAX;
/// In no list.
const NOWHERE: u8 = u8::MAX;

pub(crate) struct Lists<const K: usize> {
    prev: Vec<u32>,
    next: Vec<u32>,
    which: Vec<u8>,
    /// Most recent end.
    head: [u32; K],
    /// Least recent end.
    tail: [u32; K],
    len: [usize; K],
}

impl<const K: usize> Lists<K> {
    pub(crate) fn new(ids: usize) -> Self {
        Lists {
            prev: vec![NIL; ids],
            next: vec![NIL; ids],
            which: vec![NOWHERE; ids],
            head: [NIL; K],
            tail: [NIL; K],
            len: [0; K],
        }
    }

    /// The list `id` is in.
    pub(crate) fn list_of(&self, id: u32) -> Option<usize> {
        let w = self.which[id as usize];
        (w != NOWHERE).then_some(w as usize)
    }

    pub(crate) fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    /// Put `id` (in no list) at the most recent end of `list`.
    pub(crate) fn push_front(&mut self, list: usize, id: u32) {
        debug_assert!(self.list_of(id).is_none());
        let i = id as usize;
        self.which[i] = list as u8;
        self.prev[i] = NIL;
        self.next[i] = self.head[list];
        match self.head[list] {
            NIL => self.tail[list] = id,
            h => self.prev[h as usize] = id,
        }
        self.head[list] = id;
        self.len[list] += 1;
    }

    /// Take `id` out of whatever list holds it.
    pub(crate) fn remove(&mut self, id: u32) {
        let Some(list) = self.list_of(id) else { return };
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head[list] = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail[list] = p,
            n => self.prev[n as usize] = p,
        }
        self.which[i] = NOWHERE;
        self.len[list] -= 1;
    }

    /// Take the least recent id of `list`.
    pub(crate) fn pop_back(&mut self, list: usize) -> Option<u32> {
        let id = self.tail[list];
        if id == NIL {
            return None;
        }
        self.remove(id);
        Some(id)
    }

    pub(crate) fn move_to_front(&mut self, list: usize, id: u32) {
        self.remove(id);
        self.push_front(list, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_leave_in_the_order_they_were_last_pushed() {
        let mut l = Lists::<2>::new(8);
        for id in 0..5 {
            l.push_front(0, id);
        }
        l.move_to_front(0, 1);
        l.move_to_front(1, 3);
        assert_eq!((l.len(0), l.len(1)), (4, 1));
        let order: Vec<u32> = std::iter::from_fn(|| l.pop_back(0)).collect();
        assert_eq!(order, [0, 2, 4, 1]);
        assert_eq!(l.list_of(3), Some(1));
        assert_eq!(l.pop_back(1), Some(3));
        assert_eq!(l.pop_back(1), None);
    }
}
