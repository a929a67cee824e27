//! A lazy clean for a fork: the dirty pages are written after the fork,
//! not during it (`Region::pause_lazy`).
//!
//! Why: the eager clean (`fork/clean.rs`) writes every dirty page before
//! the fork goes on, and the program waits: ~4.5 us a page over a loopback
//! donor, 276 ms for redis at a quarter of 1 GiB, seconds for a budget of
//! gigabytes on a real link. Here the pause only write-protects the dirty
//! runs (one ioctl a run) and lists them as *pending*. The child shares
//! them; the handler writes them between faults, and tells a sink
//! (`ForkWritten`) which landed, so that the snapshot owes them from then
//! on and the child may drop its shared copies.
//!
//! What keeps the child's view right: a pending page is write-protected
//! since the pause, so its bytes are the fork's until a write faults, and
//! every way it could change goes through here first:
//! - a write (its WP fault) writes it, and the pages after it, first;
//! - eviction writes pending victims before moving them out;
//! - a REMOVE or UNMAP forgets it: the child keeps its shared copy for good
//!   (the parent's next bytes there are not the fork's);
//! - the next fork writes every pending page before its own pause.
//!
//! The store sees the fork's bytes of a pending page in its first write
//! after the fork, before the snapshot owes the page, so that write keeps
//! no "old" bytes; the sink makes the snapshot owe it before any later
//! write can start (they all come from this thread).

use crate::fork::page_bits::PageBits;
use crate::shared::Core;
use crate::stats::Counters;

/// Told which pending pages now hold in the store what they held at the
/// fork. Called on the handler's thread, between faults: it must not block
/// for long.
pub trait ForkWritten: Send {
    /// `pages` are written. False if nobody wants the rest any more (the
    /// child is gone): the handler then stops writing pending pages early.
    fn written(&mut self, pages: &[u32]) -> bool;
}

/// Pending pages written in one turn between faults: a fault that comes
/// meanwhile waits for at most this many (~0.3 ms over a loopback donor).
const IDLE_CHUNK_PAGES: usize = 64;
/// Pending pages written ahead of a page a write faulted on (with it):
/// writes come in runs.
const AROUND_WRITE_PAGES: usize = 16;

#[derive(Default)]
pub(crate) struct LazyClean {
    pending: PageBits,
    /// Where the idle writes go on from.
    cursor: u32,
    sink: Option<Box<dyn ForkWritten>>,
}

impl LazyClean {
    pub(crate) fn busy(&self) -> bool {
        self.pending.count() > 0
    }

    pub(crate) fn has(&self, page: u32) -> bool {
        self.busy() && self.pending.has(page)
    }

    /// After the pause: write `pending` and tell `sink`. With no sink
    /// nobody would learn of the writes: nothing is pending then (the
    /// pages stay dirty; the child keeps sharing them).
    pub(crate) fn start(&mut self, pending: Vec<u64>, sink: Option<Box<dyn ForkWritten>>) {
        self.pending = PageBits::from_words(pending);
        self.cursor = 0;
        self.sink = sink;
        if self.sink.is_none() {
            self.clear();
        }
    }

    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.sink = None; // the sink's end: its child learns no more
    }

    /// Pages `first..first + count` changed in a way no write of ours
    /// shows (discarded, unmapped): the child keeps its copies.
    pub(crate) fn forget(&mut self, first: u32, count: u32) {
        if !self.busy() {
            return;
        }
        for page in first..first.saturating_add(count) {
            self.take(page);
        }
        if !self.busy() {
            self.clear();
        }
    }

    /// Clear `page`'s bit: whether it was set.
    fn take(&mut self, page: u32) -> bool {
        self.pending.take(page)
    }

    /// Take up to `max` pending pages from the cursor on (wrapping once).
    fn take_next(&mut self, max: usize, out: &mut Vec<u32>) {
        let pages = self.pending.span_pages();
        // Bounded: one pass over the bits at most.
        for step in 0..pages {
            if out.len() >= max || !self.busy() {
                break;
            }
            let page = (self.cursor + step) % pages;
            if self.take(page) {
                out.push(page);
            }
        }
        self.cursor = out.last().map_or(0, |&p| p + 1);
    }

    /// Take `page` if pending, with the pending pages right after it.
    fn take_run(&mut self, page: u32, max: usize, out: &mut Vec<u32>) {
        // Bounded by `max`.
        for p in page..page.saturating_add(max as u32) {
            if !self.take(p) {
                break;
            }
            out.push(p);
        }
    }

    /// Write `pages` (taken from the pending set) and tell the sink.
    fn write_taken(&mut self, core: &mut Core, pages: &[u32]) {
        if pages.is_empty() {
            return;
        }
        let mut cleaned = Vec::with_capacity(pages.len());
        crate::fork::clean::clean_pages(core, pages, &mut cleaned);
        Counters::add(&core.counters.pages_cleaned_after_fork, cleaned.len() as u64);
        let wanted = match self.sink.as_mut() {
            Some(sink) if !cleaned.is_empty() => sink.written(&cleaned),
            _ => true,
        };
        if !wanted || !self.busy() {
            self.clear();
        }
    }

    /// Between faults: write the next few pending pages.
    pub(crate) fn write_some(&mut self, core: &mut Core) {
        let mut pages = Vec::with_capacity(IDLE_CHUNK_PAGES);
        self.take_next(IDLE_CHUNK_PAGES, &mut pages);
        self.write_taken(core, &pages);
    }

    /// Before a fork: write every pending page of the last one.
    pub(crate) fn write_all(&mut self, core: &mut Core) {
        // Bounded: each turn takes pages out of the set, or it is empty.
        while self.busy() {
            self.write_some(core);
        }
    }

    /// A write faulted on `page`: write it (and the pending run after it)
    /// first, so that its fork bytes reach the store before its new ones.
    pub(crate) fn write_before_change(&mut self, core: &mut Core, page: u32) {
        let mut pages = Vec::with_capacity(AROUND_WRITE_PAGES);
        self.take_run(page, AROUND_WRITE_PAGES, &mut pages);
        self.write_taken(core, &pages);
    }

    /// Eviction chose `victims`: write the pending ones first (they leave
    /// `Clean`, so eviction drops them with no write of its own).
    pub(crate) fn write_victims(&mut self, core: &mut Core, victims: &[u32]) {
        if !self.busy() {
            return;
        }
        let pages: Vec<u32> = victims.iter().copied().filter(|&p| self.take(p)).collect();
        self.write_taken(core, &pages);
    }
}

/// At a lazy pause: write-protect the mapped `Dirty` pages where they are,
/// and list them (one bit a page). Nothing is written, so nothing is read:
/// one UFFDIO_WRITEPROTECT over the whole region does it (the `Clean`
/// pages are protected already, and the missing ones are not touched).
/// Scattered dirty pages took one ioctl a run: 103 ms for redis's 54 K
/// (`forklazy_1.json`). If that call fails, run by run.
pub(crate) fn protect_dirty(core: &Core) -> Vec<u64> {
    let dirty = crate::fork::clean::dirty_pages(core);
    let mut bits = vec![0u64; (core.pages as usize).div_ceil(64)];
    let whole = core.pages as usize * memlend_store::PAGE_SIZE;
    match core.uffd.protect(core.base, whole) {
        Ok(()) => {
            dirty.iter().for_each(|&p| bits[p as usize / 64] |= 1 << (p % 64));
            return bits;
        }
        Err(e) => tracing::warn!("fault handler: protecting the region for a fork: {e}"),
    }
    let mut runs = Vec::new();
    // Bounded: each turn takes up to a chunk of the list.
    for chunk in dirty.chunks(4096) {
        runs.clear();
        crate::fork::clean::protect_mapped_runs(core, chunk, &mut runs);
        for &(first, count) in &runs {
            (first..first + count).for_each(|p| bits[p as usize / 64] |= 1 << (p % 64));
        }
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pages: &[u32]) -> LazyClean {
        let mut bits = vec![0u64; 2];
        pages.iter().for_each(|&p| bits[p as usize / 64] |= 1 << (p % 64));
        LazyClean { pending: PageBits::from_words(bits), ..LazyClean::default() }
    }

    #[test]
    fn pages_are_taken_once_whichever_way() {
        let mut lazy = set(&[3, 4, 5, 9, 70, 127]);
        let mut out = Vec::new();
        lazy.take_run(4, 16, &mut out);
        assert_eq!(out, [4, 5], "a run stops at the first page not pending");
        out.clear();
        lazy.take_next(2, &mut out);
        assert_eq!(out, [3, 9]);
        lazy.forget(100, 28);
        assert!(!lazy.has(127) && lazy.has(70));
        out.clear();
        lazy.take_next(8, &mut out);
        assert_eq!(out, [70]);
        assert!(!lazy.busy());
    }

    #[test]
    fn the_idle_writes_wrap_around_to_pages_behind_the_cursor() {
        let mut lazy = set(&[1, 100]);
        lazy.cursor = 50;
        let mut out = Vec::new();
        lazy.take_next(8, &mut out);
        assert_eq!(out, [100, 1]);
    }

    #[test]
    fn without_a_sink_nothing_is_pending() {
        let mut lazy = LazyClean::default();
        lazy.start(vec![0b1011], None);
        assert!(!lazy.busy() && !lazy.has(0));
    }
}
