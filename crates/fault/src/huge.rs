//! Huge pages for a region whose pages all fit its budget.
//!
//! The handler maps 4 KiB pages (UFFDIO_COPY has no huge variant for
//! anonymous memory), so a far region never gets the 2 MiB pages that the
//! kernel gives a program's own memory. For a program that reads its data
//! scattered, each access then costs a TLB miss and a page walk, which in a
//! VM is two: numpy's gathers over a 512 MiB table ran 11-16% slower with
//! 4 KiB pages (`NUMPY_MADVISE_HUGEPAGE=0`), and under `memlend run` with
//! room for all of it, 0.88x all-local.
//!
//! While every page held fits the budget with room to spare, no page will
//! be evicted, so a 2 MiB chunk whose 512 pages are all mapped writable can
//! be collapsed into one huge page (MADV_COLLAPSE works on a registered
//! range whose pages are all present and none write-protected). Eviction
//! later still works a page at a time: UFFDIO_MOVE, UFFDIO_WRITEPROTECT and
//! MADV_DONTNEED split a huge page first (a few hundred µs, once a chunk).
//!
//! A collapse copies 2 MiB and takes the process's mmap lock for writing
//! (2.6-4.2 ms a chunk here), so it runs on a thread of its own, at most
//! `CHUNKS_PER_SCAN_MAX` chunks a scan, one scan a second, and only while
//! the region fits: faults then are rare. The region's pages keep their
//! states; a collapse changes where bytes sit, never what they are.

use crate::state::{PageState, PageTable};
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pages in one huge page (2 MiB on x86-64).
pub(crate) const CHUNK_PAGES: usize = 512;
const CHUNK_BYTES: usize = CHUNK_PAGES * PAGE_SIZE;
/// Look for chunks to collapse at most this often.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// Chunks handed to the collapsing thread per scan (128 MiB), and so at
/// most that many queued: a scan never waits for it.
const CHUNKS_PER_SCAN_MAX: usize = 64;
/// Page states read per scan, so that a scan of a large region that is
/// mostly not full stays short (~0.3 ms).
const PAGES_PER_SCAN_MAX: usize = 256 * 1024;
/// Room that must stay free under the budget besides the chunk: a collapse
/// briefly holds the old pages and the new huge page both.
const SLACK_CHUNKS: usize = 2;
/// A region whose pages held grew, since the last scan, by more than this
/// share of the room left is still filling (a program building its data):
/// wait, rather than collapse chunks eviction may soon split. With an
/// eighth, SQLite loading 512 MiB at half its memory (42 MiB/s) had 137
/// chunks collapsed that eviction split again within seconds.
const GROWTH_SHARE_OF_ROOM: usize = 32;
/// After this many collapses in a row fail (THP off in this kernel, or
/// never any room for a huge page), stop trying.
const FAILURES_IN_A_ROW_MAX: u64 = 16;

/// Which chunks to collapse, and the thread that does it.
pub(crate) struct Huge {
    /// First page of the first 2 MiB-aligned chunk, and how many chunks.
    first_page: u32,
    chunks: usize,
    /// Chunks tried since the region last stopped fitting.
    tried: Vec<bool>,
    /// Where the next scan starts.
    cursor: usize,
    /// Pages held at the last scan.
    last_held: usize,
    /// `unmaps` at the last scan.
    unmaps_at_scan: u64,
    next_scan: Instant,
    tx: Option<SyncSender<Chunk>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Huge {
    /// For the region at `base` of `pages` pages; `None` if it holds no
    /// whole aligned chunk. Spawns the collapsing thread.
    pub(crate) fn start(
        base: usize,
        pages: u32,
        counters: Arc<Counters>,
    ) -> std::io::Result<Option<Huge>> {
        let end = base + pages as usize * PAGE_SIZE;
        let first = base.next_multiple_of(CHUNK_BYTES);
        let chunks = end.saturating_sub(first) / CHUNK_BYTES;
        if chunks == 0 {
            return Ok(None);
        }
        let (tx, rx) = sync_channel::<Chunk>(CHUNKS_PER_SCAN_MAX);
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("memlend-huge".into())
            .spawn(move || collapse_each(rx, &thread_counters))?;
        Ok(Some(Huge {
            first_page: ((first - base) / PAGE_SIZE) as u32,
            chunks,
            tried: vec![false; chunks],
            cursor: 0,
            last_held: 0,
            unmaps_at_scan: 0,
            next_scan: Instant::now() + SCAN_INTERVAL,
            tx: Some(tx),
            thread: Some(thread),
            counters,
        }))
    }

    /// Once a second: if the region fits (the pages it holds against a
    /// budget of `budget_pages`) and is not filling fast, hand the chunks
    /// whose pages are all mapped writable to the collapsing thread. A region that stops fitting
    /// forgets what it tried, so chunks split by eviction are tried again
    /// once it fits again.
    pub(crate) fn scan(&mut self, table: &PageTable, base: usize, budget_pages: usize) {
        let now = Instant::now();
        if now < self.next_scan || self.given_up() {
            return;
        }
        self.next_scan = now + SCAN_INTERVAL;
        let unmaps_now = unmaps(&self.counters);
        if std::mem::replace(&mut self.unmaps_at_scan, unmaps_now) != unmaps_now {
            // Chunks queued meanwhile may have been skipped (`Chunk`); one
            // already huge costs a few µs to try again.
            self.tried.fill(false);
        }
        let held = table.held();
        let grew = held.saturating_sub(std::mem::replace(&mut self.last_held, held));
        let room = budget_pages.saturating_sub(held + SLACK_CHUNKS * CHUNK_PAGES);
        if room < CHUNK_PAGES {
            self.tried.fill(false);
            return;
        }
        if grew > room / GROWTH_SHARE_OF_ROOM {
            // Still growing fast: it may not fit for long, and collapsing
            // what eviction would split again is work thrown away.
            return;
        }
        let (mut sent, mut read) = (0, 0);
        for _ in 0..self.chunks {
            if sent == CHUNKS_PER_SCAN_MAX || read >= PAGES_PER_SCAN_MAX {
                break;
            }
            let chunk = self.cursor;
            self.cursor = (self.cursor + 1) % self.chunks;
            if self.tried[chunk] {
                continue;
            }
            let first = self.first_page as usize + chunk * CHUNK_PAGES;
            let pages = first as u32..(first + CHUNK_PAGES) as u32;
            read += CHUNK_PAGES;
            if !pages.into_iter().all(|p| table.get(p) == PageState::Dirty) {
                continue;
            }
            let Some(tx) = &self.tx else { return };
            let unmaps_seen = unmaps(&self.counters);
            match tx.try_send(Chunk { addr: base + first * PAGE_SIZE, unmaps_seen }) {
                Ok(()) => {
                    self.tried[chunk] = true;
                    sent += 1;
                }
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => return,
            }
        }
    }

    fn given_up(&self) -> bool {
        self.counters.huge_failures_in_a_row.load(Relaxed) >= FAILURES_IN_A_ROW_MAX
    }
}

impl Drop for Huge {
    /// The thread must be gone before the region is unmapped: a collapse
    /// after that could land on memory mapped anew at the same address.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A chunk to collapse, and the unmap events the handler had read when it
/// chose it.
struct Chunk {
    addr: usize,
    unmaps_seen: u64,
}

/// munmap and mremap events read so far. The program may unmap region
/// memory and map something else there while a chunk waits in the queue
/// (up to 64 chunks of a few ms each); the kernel makes munmap wait until
/// the handler has read its event, so a chunk still counts as the region's
/// only if no such event was read since it was chosen. The window left is
/// between this check and the collapse, microseconds, and what it risks is
/// huge-page advice on another mapping, not its bytes.
fn unmaps(counters: &Counters) -> u64 {
    counters.unmap_events.load(Relaxed) + counters.remap_events.load(Relaxed)
}

/// The collapsing thread: each chunk in turn, until the handler drops its
/// sender.
fn collapse_each(rx: std::sync::mpsc::Receiver<Chunk>, counters: &Counters) {
    for Chunk { addr, unmaps_seen } in rx {
        if unmaps(counters) != unmaps_seen {
            continue;
        }
        match crate::kernel::mem::collapse_huge(addr, CHUNK_BYTES) {
            Ok(()) => {
                counters.huge_collapsed.fetch_add(1, Relaxed);
                counters.huge_failures_in_a_row.store(0, Relaxed);
            }
            Err(e) => {
                counters.huge_failed.fetch_add(1, Relaxed);
                let in_a_row = counters.huge_failures_in_a_row.fetch_add(1, Relaxed) + 1;
                if in_a_row == FAILURES_IN_A_ROW_MAX {
                    tracing::info!(
                        "huge pages: {in_a_row} collapses failed in a row ({e}); no more"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::mem::Mapping;

    /// One aligned chunk of `map`, its pages written.
    fn written_chunk(map: &Mapping) -> usize {
        let addr = map.addr().next_multiple_of(CHUNK_BYTES);
        for page in 0..CHUNK_PAGES {
            // SAFETY: inside our own live mapping (two chunks long).
            unsafe { ((addr + page * PAGE_SIZE) as *mut u64).write_volatile(page as u64 + 1) };
        }
        addr
    }

    fn collapse(chunks: Vec<Chunk>, counters: &Counters) {
        let (tx, rx) = sync_channel(chunks.len());
        chunks.into_iter().for_each(|c| tx.send(c).unwrap());
        drop(tx);
        collapse_each(rx, counters);
    }

    #[test]
    fn a_chunk_chosen_before_an_unmap_is_left_alone() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.is_ok_and(|s| s.contains("[never]")) {
            return memlend_testskip::skip("transparent huge pages are off");
        }
        let map = Mapping::new(2 * CHUNK_PAGES).unwrap();
        let addr = written_chunk(&map);
        let counters = Counters::default();
        counters.unmap_events.store(1, Relaxed);
        collapse(vec![Chunk { addr, unmaps_seen: 0 }], &counters);
        assert_eq!(counters.huge_collapsed.load(Relaxed) + counters.huge_failed.load(Relaxed), 0);

        collapse(vec![Chunk { addr, unmaps_seen: 1 }], &counters);
        assert_eq!(counters.huge_collapsed.load(Relaxed), 1, "failed {:?}", counters.huge_failed);
        for page in 0..CHUNK_PAGES {
            // SAFETY: as in `written_chunk`.
            let got = unsafe { ((addr + page * PAGE_SIZE) as *const u64).read_volatile() };
            assert_eq!(got, page as u64 + 1);
        }
    }
}
