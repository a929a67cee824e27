//! Pages the owner made inaccessible (`PROT_NONE`: a reservation not yet
//! committed, or uncommitted again), told through `Region::fence`, one bit
//! a page, read by the handler without a lock.
//!
//! Why: a fault never comes from such a page (the kernel refuses the access
//! first), but the handler maps pages ahead of faults (prefetch windows,
//! zero-fill ahead). A page mapped into a `PROT_NONE` range holds budget
//! for nothing, and cannot move out again: UFFDIO_MOVE wants the same
//! protection at both ends, and staging is read-write. So prefetch stops at
//! a fence. The bits are a hint for what is mapped ahead, never for a
//! fault: a page fenced wrongly only goes without prefetch.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(crate) struct Fences {
    bits: Vec<AtomicU64>,
    pages: u32,
}

impl Fences {
    pub(crate) fn new(pages: u32) -> Fences {
        let bits = (0..(pages as usize).div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Fences { bits, pages }
    }

    /// Fence (or open) pages `first..first + count`; pages past the end
    /// are ignored.
    pub(crate) fn set(&self, first: u32, count: u32, fenced: bool) {
        let end = (first as u64 + count as u64).min(u64::from(self.pages));
        // Bounded by the region's pages.
        for page in first as u64..end {
            let (word, bit) = ((page / 64) as usize, 1u64 << (page % 64));
            if fenced {
                self.bits[word].fetch_or(bit, Relaxed);
            } else {
                self.bits[word].fetch_and(!bit, Relaxed);
            }
        }
    }

    pub(crate) fn has(&self, page: u32) -> bool {
        if page >= self.pages {
            return false;
        }
        let word = page as usize / 64;
        self.bits.get(word).is_some_and(|w| w.load(Relaxed) & (1 << (page % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_fenced_and_opened_to_its_edges() {
        let f = Fences::new(200);
        f.set(60, 10, true);
        assert!(!f.has(59) && f.has(60) && f.has(69) && !f.has(70));
        f.set(62, 3, false);
        assert!(f.has(61) && !f.has(62) && !f.has(64) && f.has(65));
        f.set(190, 100, true); // runs past the end: cut there
        assert!(f.has(199) && !f.has(200));
    }
}
