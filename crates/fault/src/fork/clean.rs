//! Before a fork of a region whose pages do not all fit its budget: every
//! `Dirty` page is written to the store and counted `Clean`, so that the
//! child can drop every page it shares and read them all through its
//! parent ("Forked children" in DESIGN.md).
//!
//! Why: a page the fork shares stays in memory as long as either process
//! maps it. The parent evicts (and the child keeps) what the budget has no
//! room for, so a shared page the parent evicts frees nothing; under a
//! binding memory limit that doubled the resident set and redis was
//! OOM-killed during BGSAVE. A child that drops its shared pages holds only
//! its own budget, but it may drop only pages whose bytes at the fork the
//! store keeps: `Clean` and `InStore` ones.
//!
//! How: runs of `Dirty` pages are write-protected where they are
//! (UFFDIO_WRITEPROTECT) and written to the store straight from the
//! region, `CLEAN_CHUNK_PAGES` in one store call; then they are `Clean`:
//! their PTEs are protected already and the store holds their bytes. A
//! thread writing such a page meanwhile raises a WP fault, which waits for
//! the handler and then makes the page `Dirty` again; readers go on. A page
//! not mapped is skipped, and one whose write fails is unprotected and
//! stays `Dirty` (the child keeps sharing it).
//!
//! The first build moved each run out to staging with UFFDIO_MOVE, wrote
//! it from there and copied it back write-protected: a TLB flush, a second
//! page and a copy each, readers of a page out waited for the handler, a
//! copy back that failed for want of memory lost the page, and pages an
//! older fork still shared could not move and stayed `Dirty`.

use crate::kernel::mem::mapped_pages;
use crate::shared::Core;
use crate::state::PageState;
use crate::stats::Counters;
use memlend_store::{WriteOp, PAGE_SIZE};

/// Pages written in one store call. Nothing is copied (the store reads
/// the protected pages where they are), so this bounds only the store's
/// own buffers for one call, and the number of round trips: 32 pages a
/// call ran at 5-6 us a page over a loopback donor.
const CLEAN_CHUNK_PAGES: usize = 256;

/// Clean every `Dirty` page that can be, `CLEAN_CHUNK_PAGES` at a time.
/// Every write-back must be settled first: the handler writes these
/// itself, and no other write of the same pages may be in flight.
pub(crate) fn clean_for_fork(core: &mut Core) {
    let dirty = dirty_pages(core);
    clean_pages(core, &dirty, &mut Vec::new());
}

/// Every `Dirty` page, in order.
pub(crate) fn dirty_pages(core: &Core) -> Vec<u32> {
    (0..core.pages).filter(|&p| core.table.get(p) == PageState::Dirty).collect()
}

/// Clean those of `pages` (in order) that are `Dirty` and mapped,
/// `CLEAN_CHUNK_PAGES` at a time; the pages cleaned go into `cleaned`.
pub(crate) fn clean_pages(core: &mut Core, pages: &[u32], cleaned: &mut Vec<u32>) {
    let dirty: Vec<u32> =
        pages.iter().copied().filter(|&p| core.table.get(p) == PageState::Dirty).collect();
    let mut runs = Vec::new();
    // Bounded: each turn takes up to `CLEAN_CHUNK_PAGES` of the list.
    for chunk in dirty.chunks(CLEAN_CHUNK_PAGES) {
        runs.clear();
        protect_mapped_runs(core, chunk, &mut runs);
        if runs.is_empty() {
            continue;
        }
        let ops: Vec<WriteOp<'_>> = runs
            .iter()
            .map(|&(page, count)| WriteOp {
                page: u64::from(page),
                // SAFETY: the run is mapped (checked when it was protected,
                // and nothing unmaps it while the handler reads no events)
                // and write-protected, so no thread changes it meanwhile.
                data: unsafe {
                    std::slice::from_raw_parts(
                        core.page_addr(page) as *const u8,
                        count as usize * PAGE_SIZE,
                    )
                },
            })
            .collect();
        let result = core.store.write(&ops);
        drop(ops);
        settle_runs(core, &runs, result.is_ok());
        if result.is_ok() {
            runs.iter().for_each(|&(first, count)| cleaned.extend(first..first + count));
        }
        if let Err(e) = result {
            tracing::error!(
                "fault handler: writing pages for a fork failed, the child shares them: {e}"
            );
        }
    }
}

/// Write-protect the runs of `pages` that are mapped; (first page, count)
/// of each protected run goes into `runs`.
pub(crate) fn protect_mapped_runs(core: &Core, pages: &[u32], runs: &mut Vec<(u32, u32)>) {
    let mut mapped = Vec::with_capacity(pages.len());
    let mut i = 0;
    // Bounded: each turn moves past one run of consecutive pages.
    while i < pages.len() {
        let run = 1 + pages[i..].windows(2).take_while(|w| w[1] == w[0] + 1).count();
        // Reading a page that is not mapped would raise a userfault on the
        // thread that serves them. One mapped now stays mapped: the handler
        // reads no events meanwhile (see `make_exclusive`).
        if mapped_pages(core.page_addr(pages[i]), run, &mut mapped).is_ok() {
            let mut j = 0;
            // Bounded: each turn moves past at least one page of the run.
            while j < run {
                let len = mapped[j..].iter().take_while(|&&m| m).count();
                if len == 0 {
                    j += 1;
                    continue;
                }
                let first = pages[i + j];
                match core.uffd.protect(core.page_addr(first), len * PAGE_SIZE) {
                    Ok(()) => runs.push((first, len as u32)),
                    Err(e) => tracing::warn!("fault handler: protecting pages for a fork: {e}"),
                }
                j += len;
            }
        }
        i += run;
    }
}

/// After the write: `Clean` if it went through, else unprotected again
/// (still `Dirty`; a write's WP fault would unprotect it anyway).
fn settle_runs(core: &mut Core, runs: &[(u32, u32)], written: bool) {
    for &(first, count) in runs {
        if written {
            (first..first + count).for_each(|page| core.table.cleaned(page));
            Counters::add(&core.counters.pages_cleaned_for_fork, u64::from(count));
        } else if let Err(e) =
            core.uffd.unprotect(core.page_addr(first), count as usize * PAGE_SIZE)
        {
            tracing::warn!("fault handler: unprotecting pages after a failed clean: {e}");
        }
    }
}
