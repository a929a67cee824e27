//! Moving a batch of a segment's resident pages to its store, with no
//! write lost in any process that maps it:
//!
//! 1. the victims are write-protected in every process (a process that has
//!    not mapped one gets a marker, so a later mapping is protected too):
//!    from here no process can change them;
//! 2. their bytes are read from the memfd (`pread`, no mapping touched) and
//!    written to the store in one write;
//! 3. a hole is punched over them: they leave the memfd and every page
//!    table at once, and the next access anywhere is a MISSING fault;
//! 4. the protection is lifted, waking any writer that met it (its write
//!    then faults the page back).
//!
//! If a process cannot be protected now (a fork under way) or the store
//! write fails, nothing is punched: the pages stay resident.

use super::segment::Segment;
use super::stats::SharedStats;
use memlend_store::{WriteOp, PAGE_SIZE};

/// The most pages one eviction moves.
pub(crate) const BATCH_PAGES_MAX: usize = 64;

impl Segment {
    /// Move up to `want` (at most [`BATCH_PAGES_MAX`]) resident pages out.
    /// Returns how many left; processes found gone are marked in `gone`.
    pub(crate) fn evict(&mut self, want: usize, buf: &mut [u8]) -> usize {
        let victims = self.victims(want.min(BATCH_PAGES_MAX));
        if victims.is_empty() {
            return 0;
        }
        let runs = runs_of(&victims);
        let mut gone = std::mem::take(&mut self.gone);
        let written = self.each_mm(&runs, &mut gone, true) && self.copy_out(&runs, buf);
        if written {
            for &(first, count) in &runs {
                let (offset, len) =
                    (first as u64 * PAGE_SIZE as u64, count as u64 * PAGE_SIZE as u64);
                if let Err(e) = self.memfd.punch(offset, len) {
                    // The bytes are in the store as well as here: harmless,
                    // but the pages stay resident.
                    tracing::warn!("shared pages {first}+{count}: punching a hole failed: {e}");
                }
            }
        }
        // Released even where protecting failed: a process left protected
        // would wait on a write for ever. Bounded: a failure here is logged
        // and the next eviction's release covers the page again.
        self.each_mm(&runs, &mut gone, false);
        self.gone = gone;
        if !written {
            self.order.put_back(&victims);
            return 0;
        }
        for &page in &victims {
            self.far.set(page, true);
        }
        let n = victims.len() as u64;
        SharedStats::sub(&self.stats.resident_pages, n);
        SharedStats::add(&self.stats.far_pages, n);
        SharedStats::add(&self.stats.evicted_pages, n);
        victims.len()
    }

    /// The next victims, sorted (`order.rs`).
    fn victims(&mut self, want: usize) -> Vec<u32> {
        self.order.victims(want)
    }

    /// Write-protect (`on`) or release the runs in every live process.
    /// `false`: a process could not be protected now (EAGAIN: its address
    /// space is changing, as in a fork whose event this server has yet to
    /// read), so the batch must not go.
    fn each_mm(&self, runs: &[(u32, u32)], gone: &mut [bool], on: bool) -> bool {
        let mut all = true;
        for (i, uffd) in self.mms.iter().enumerate() {
            if gone[i] {
                continue;
            }
            for &(first, count) in runs {
                let (addr, len) =
                    (self.base + first as usize * PAGE_SIZE, count as usize * PAGE_SIZE);
                let done = if on { uffd.protect(addr, len) } else { uffd.unprotect(addr, len) };
                match done.map_err(|e| e.raw_os_error()) {
                    Ok(()) | Err(Some(libc::ENOENT)) => {} // ENOENT: not mapped there
                    Err(Some(libc::ESRCH)) => {
                        gone[i] = true;
                        break;
                    }
                    Err(e) => {
                        if e != Some(libc::EAGAIN) {
                            tracing::warn!(
                                "shared pages {first}+{count}: write-protect {on}: {e:?}"
                            );
                        }
                        all = false;
                    }
                }
            }
        }
        all
    }

    /// The victims' bytes from the memfd to the store. `false`: not written.
    fn copy_out(&self, runs: &[(u32, u32)], buf: &mut [u8]) -> bool {
        let mut at = 0;
        for &(first, count) in runs {
            let len = count as usize * PAGE_SIZE;
            if let Err(e) =
                self.memfd.read_at(&mut buf[at..at + len], u64::from(first) * PAGE_SIZE as u64)
            {
                tracing::warn!("shared pages {first}+{count}: reading them failed: {e}");
                return false;
            }
            at += len;
        }
        let mut ops = Vec::with_capacity(runs.len());
        let mut at = 0;
        for &(first, count) in runs {
            let len = count as usize * PAGE_SIZE;
            ops.push(WriteOp { page: u64::from(first), data: &buf[at..at + len] });
            at += len;
        }
        match self.store.write(&ops) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("shared pages: the store write failed ({e}); they stay resident");
                false
            }
        }
    }
}

/// Sorted pages as runs of consecutive ones: (first, count).
pub(crate) fn runs_of(pages: &[u32]) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &page in pages {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == page => *count += 1,
            _ => runs.push((page, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_join_neighbours_only() {
        assert_eq!(super::runs_of(&[1, 2, 3, 7, 9, 10]), vec![(1, 3), (7, 1), (9, 2)]);
        assert!(super::runs_of(&[]).is_empty());
    }
}
