//! One bit a page of a segment.

/// One bit a page.
pub(crate) struct Bits(Vec<u64>);

impl Bits {
    pub(crate) fn new(pages: u32) -> Bits {
        Bits(vec![0; (pages as usize).div_ceil(64)])
    }
    pub(crate) fn get(&self, page: u32) -> bool {
        self.0[page as usize / 64] & (1 << (page % 64)) != 0
    }
    pub(crate) fn set(&mut self, page: u32, on: bool) {
        let (word, bit) = (page as usize / 64, 1u64 << (page % 64));
        if on {
            self.0[word] |= bit;
        } else {
            self.0[word] &= !bit;
        }
    }
}
