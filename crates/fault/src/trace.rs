//! A page-access trace of one region, for replaying eviction policies
//! offline (`memlend replay`).
//!
//! userfaultfd shows the handler a page only when it is not mapped (or a
//! write hits a write-protected one), so a trace taken under a normal budget
//! records misses, not accesses. A tracing region therefore keeps a tiny
//! budget (`WINDOW_PAGES`), maps nothing ahead and everything
//! write-protected: then nearly every access to a page outside the last
//! few hundred touched is a fault, and lands here. What it misses are
//! re-uses within that window, which every policy replayed with a far
//! larger cache serves as hits anyway.
//!
//! The file is a flat array of little-endian u32, one per fault:
//! `page << 1 | write`. Entries are written in blocks, so a process that
//! dies loses at most the last block.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// The resident budget of a tracing region: 1 MiB.
pub const WINDOW_PAGES: usize = 256;
/// Entries buffered before a write (16 KiB).
const BLOCK_ENTRIES: usize = 4096;
/// At most this many entries (1 GiB of trace); past it, recording stops.
const ENTRIES_MAX: u64 = 1 << 28;

pub(crate) struct Trace {
    file: File,
    block: Vec<u32>,
    entries: u64,
}

impl Trace {
    pub(crate) fn create(path: &Path) -> io::Result<Trace> {
        let file = File::create(path)?;
        Ok(Trace { file, block: Vec::with_capacity(BLOCK_ENTRIES), entries: 0 })
    }

    /// One access: `page`, written or not. Pages are below 2^31 (a region
    /// of 8 TiB); a larger one is not recorded.
    pub(crate) fn record(&mut self, page: u32, write: bool) {
        if self.entries >= ENTRIES_MAX || page >= 1 << 31 {
            return;
        }
        self.block.push(page << 1 | u32::from(write));
        self.entries += 1;
        if self.block.len() == BLOCK_ENTRIES {
            self.flush();
        }
        if self.entries == ENTRIES_MAX {
            tracing::warn!("fault handler: the trace reached {ENTRIES_MAX} entries; no more");
        }
    }

    pub(crate) fn flush(&mut self) {
        let bytes: Vec<u8> = self.block.iter().flat_map(|e| e.to_le_bytes()).collect();
        self.block.clear();
        if let Err(e) = self.file.write_all(&bytes) {
            tracing::error!("fault handler: writing the trace failed: {e}; tracing stops");
            self.entries = ENTRIES_MAX;
        }
    }
}

/// Read a trace file back: `(page, write)` per entry.
pub fn read(path: &Path) -> io::Result<Vec<(u32, bool)>> {
    let bytes = std::fs::read(path)?;
    if bytes.len() % 4 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {} bytes is not a whole number of entries", path.display(), bytes.len()),
        ));
    }
    let entry = |c: &[u8]| u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    Ok(bytes.chunks_exact(4).map(entry).map(|e| (e >> 1, e & 1 == 1)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_reads_back_as_written_but_for_the_unflushed_tail() {
        let dir = std::env::temp_dir().join(format!("memlend-trace-{}", std::process::id()));
        let mut trace = Trace::create(&dir).unwrap();
        let n = BLOCK_ENTRIES as u32 + 10;
        for i in 0..n {
            trace.record(i * 3, i % 2 == 1);
        }
        trace.flush();
        let back = read(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(back.len(), n as usize);
        for (i, &(page, write)) in back.iter().enumerate() {
            assert_eq!((page, write), (i as u32 * 3, i % 2 == 1));
        }
    }

    #[test]
    fn a_torn_file_is_an_error_that_names_it() {
        let path = std::env::temp_dir().join(format!("memlend-torn-{}", std::process::id()));
        std::fs::write(&path, [1, 2, 3, 4, 5]).unwrap();
        let err = read(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(err.to_string().contains("memlend-torn"), "{err}");
    }
}
