//! The cleaner: a packed bin keeps its room until its last entry goes, so
//! rewrites leave bins part-empty and the pages below hold less than they
//! could (measured: 2.03x written, 1.4x held after redis 50/50). With each
//! chunk of a write, the live entries of up to `CLEAN_BINS_MAX` bins that
//! fell to half full are read back and written again with the chunk,
//! as they are (no second compression); the bins they leave empty are
//! freed like any other.
//!
//! Safe against racing writers: an entry moves only if, when the chunk
//! settles, its page still lives exactly where the cleaner found it.
//! A bin is never rewritten while it holds a live entry, so bytes read
//! for an entry that is still live at that moment are that entry's.

use super::{loc, push_entry, Map, Pack, CLEAN_BINS_MAX, ENTRY_PREFIX, SPARSE_BYTES};
use crate::{PageStore, ReadOp, PAGE_SIZE};

/// Sparse candidates looked at per chunk, at most (stale ones included).
const LOOKS_MAX: usize = 64;

/// A live entry of a sparse bin, copied (prefix and bytes) into the
/// chunk's packed bytes at `start`.
pub(super) struct Moved {
    pub page: u64,
    pub start: usize,
    pub len: usize,
    /// Where it lived: it moves only if it still lives there.
    pub old: u64,
}

impl Map {
    /// Up to `n` bins that are still sparse, off the candidate list.
    fn take_sparse(&mut self, n: usize) -> Vec<u32> {
        let mut bins = Vec::new();
        for _ in 0..LOOKS_MAX {
            let Some(bin) = self.sparse.pop() else { break };
            self.in_sparse[bin as usize] = false;
            let live_bytes = usize::from(self.live_bytes[bin as usize]);
            if self.live[bin as usize] > 0 && live_bytes > 0 && live_bytes <= SPARSE_BYTES {
                bins.push(bin);
                if bins.len() == n {
                    break;
                }
            }
        }
        bins
    }
}

/// The entries a bin's bytes say it holds: (page, offset of its bytes,
/// length), as far as they make sense (the bytes come from the store
/// below, so every field is checked).
fn entries_of(bin: &[u8]) -> impl Iterator<Item = (u64, usize, usize)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let prefix = bin.get(at..at + ENTRY_PREFIX)?;
        let page = u64::from(u32::from_le_bytes(prefix[..4].try_into().ok()?));
        let len = usize::from(u16::from_le_bytes(prefix[4..].try_into().ok()?));
        let offset = at + ENTRY_PREFIX;
        if len == 0 || offset + len > PAGE_SIZE {
            return None;
        }
        at = offset + len;
        Some((page, offset, len))
    })
}

impl<S: PageStore> Pack<S> {
    /// The live entries of a few sparse bins, appended to `packed`. Best
    /// effort: a failed read below cleans nothing this time.
    pub(super) fn gather_sparse(&self, packed: &mut Vec<u8>) -> Vec<Moved> {
        let bins = self.map.lock().take_sparse(CLEAN_BINS_MAX);
        if bins.is_empty() {
            return Vec::new();
        }
        let mut buf = vec![0u8; bins.len() * PAGE_SIZE];
        {
            let _reading = self.gate.read();
            let mut ops: Vec<ReadOp<'_>> = bins
                .iter()
                .zip(buf.chunks_mut(PAGE_SIZE))
                .map(|(&bin, buf)| ReadOp { page: u64::from(bin), buf })
                .collect();
            ops.sort_unstable_by_key(|op| op.page);
            if self.inner.read(&mut ops).is_err() {
                return Vec::new();
            }
        }
        let map = self.map.lock();
        let mut moved = Vec::new();
        for (&bin, bytes) in bins.iter().zip(buf.chunks(PAGE_SIZE)) {
            for (page, offset, len) in entries_of(bytes) {
                let at = loc(bin, offset, len);
                if map.loc_of.get(page as usize).is_some_and(|&now| now == at) {
                    moved.push(Moved { page, start: packed.len(), len, old: at });
                    push_entry(packed, page, &bytes[offset..offset + len]);
                }
            }
        }
        moved
    }
}
