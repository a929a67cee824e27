//! A set of page numbers, one bit a page, that counts its members: the
//! lazy clean's pending pages (`fork/lazy.rs`), the pages a fork shared
//! (`fork/unshare.rs`).

#[derive(Default)]
pub(crate) struct PageBits {
    words: Vec<u64>,
    count: usize,
}

impl PageBits {
    /// The pages whose bits are set in `words`.
    pub(crate) fn from_words(words: Vec<u64>) -> PageBits {
        let count = words.iter().map(|w| w.count_ones() as usize).sum();
        PageBits { words, count }
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Pages the set can hold: page numbers below this.
    pub(crate) fn span_pages(&self) -> u32 {
        (self.words.len() * 64) as u32
    }

    /// Room for pages below `pages`.
    pub(crate) fn grow_to(&mut self, pages: u32) {
        let words = (pages as usize).div_ceil(64);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
    }

    pub(crate) fn has(&self, page: u32) -> bool {
        self.words.get(page as usize / 64).is_some_and(|w| w & (1 << (page % 64)) != 0)
    }

    /// Add `page` (within `span_pages`); whether it was new.
    pub(crate) fn insert(&mut self, page: u32) -> bool {
        let word = &mut self.words[page as usize / 64];
        let bit = 1 << (page % 64);
        let new = *word & bit == 0;
        *word |= bit;
        // Not `+= usize::from(new)`: rustc 1.95 at opt-level 2 or 3 drops
        // that add when the bool is also returned and branched on (rust-lang/
        // rust#158206; `counts_what_it_holds` caught it here).
        if new {
            self.count += 1;
        }
        new
    }

    /// Remove `page`; whether it was there.
    pub(crate) fn take(&mut self, page: u32) -> bool {
        let Some(word) = self.words.get_mut(page as usize / 64) else { return false };
        let bit = 1 << (page % 64);
        let was = *word & bit != 0;
        *word &= !bit;
        if was {
            self.count -= 1;
        }
        was
    }

    pub(crate) fn clear(&mut self) {
        self.words.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_it_holds() {
        let mut set = PageBits::from_words(vec![0b101, 1 << 63]);
        assert_eq!((set.count(), set.span_pages()), (3, 128));
        assert!(set.has(2) && set.has(127) && !set.has(1) && !set.has(500));
        // As callers use them: the bool returned, branched on at once.
        assert!(!set.insert(2) && set.insert(1));
        assert_eq!(set.count(), 4);
        assert!(set.take(1) && !set.take(1) && !set.take(500));
        assert_eq!(set.count(), 3);
        set.grow_to(200);
        assert!(set.insert(199) && set.count() == 4);
        set.clear();
        assert_eq!((set.count(), set.span_pages()), (0, 0));
    }
}
