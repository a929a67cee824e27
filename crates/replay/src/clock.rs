//! CLOCK (second chance): one reference bit per page, set by any access,
//! as the kernel's accessed bit is; the hand evicts the first page whose
//! bit is clear, clearing the bits it passes.

use crate::Cache;

const EMPTY: u32 = u32::MAX;

pub(crate) struct Clock {
    frames: Vec<u32>,
    referenced: Vec<bool>,
    /// Frame of each id, or EMPTY.
    frame_of: Vec<u32>,
    hand: usize,
    used: usize,
}

impl Clock {
    pub(crate) fn new(ids: usize, cache_pages: usize) -> Clock {
        Clock {
            frames: vec![EMPTY; cache_pages],
            referenced: vec![false; cache_pages],
            frame_of: vec![EMPTY; ids],
            hand: 0,
            used: 0,
        }
    }
}

impl Cache for Clock {
    fn access(&mut self, id: u32, _write: bool) -> bool {
        let frame = self.frame_of[id as usize];
        if frame != EMPTY {
            self.referenced[frame as usize] = true;
            return true;
        }
        let frame = if self.used < self.frames.len() {
            self.used += 1;
            self.used - 1
        } else {
            // Each step clears a bit or stops, so one lap and a step suffice.
            while self.referenced[self.hand] {
                self.referenced[self.hand] = false;
                self.hand = (self.hand + 1) % self.frames.len();
            }
            let victim = self.frames[self.hand];
            self.frame_of[victim as usize] = EMPTY;
            let frame = self.hand;
            self.hand = (self.hand + 1) % self.frames.len();
            frame
        };
        self.frames[frame] = id;
        self.referenced[frame] = false;
        self.frame_of[id as usize] = frame as u32;
        false
    }
}
