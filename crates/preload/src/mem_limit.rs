//! `memlend run --mem LIMIT`: the whole process, far pages and everything
//! else, stays within LIMIT. The far budget is what the rest of the process
//! leaves of it, followed every `INTERVAL` on a thread of its own.
//!
//! What counts is the resident set (`/proc/self/statm`), file pages
//! included: a memory cgroup charges the program's code and libraries to
//! the first cgroup that reads them, and not counting them (anonymous and
//! shared pages only) got redis memcg-OOM-killed under `--mem 128M` in a
//! cgroup of 128 MiB, its anonymous memory at 126 MiB.
//!
//! "The rest" is the resident set less the region's own: its mapped pages,
//! its compressed pool, and the reserve its budget keeps for the handler's
//! buffers (staging, prefetch windows). The reserve is subtracted as the
//! handler last counted it (what the buffers hold or may take next), the
//! same amount the handler keeps out of the mapped pages, so mapped pages,
//! pool, reserve and the rest together stay within LIMIT less the slack.
//! (Leaving the buffers in the rest counted them twice: a redis under
//! `--mem 128M` peaked at 112 MiB.) The
//! rest is never taken as less than it was at the start plus
//! `OWN_BUFFERS_BYTES`, for the store connections' buffers that grow only
//! once pages move. The far budget never goes below the region's
//! `BUDGET_FLOOR_PAGES` (1 MiB), with which every instruction can progress:
//! a LIMIT too small for the rest of the process is then exceeded, with a
//! warning, rather than the program stalling.

use crate::heap::Heap;
use memlend_fault::BUDGET_FLOOR_PAGES;
use memlend_store::PAGE_SIZE;
use std::time::Duration;

const INTERVAL: Duration = Duration::from_millis(50);
/// Kept free of LIMIT for what a memory cgroup counts and the resident set
/// does not (page tables, kernel buffers): a 32nd, at least 4 MiB.
const SLACK_SHARE: u64 = 32;
const SLACK_MIN_BYTES: u64 = 4 << 20;
/// What memlend's own store connections hold once pages move, and the
/// rest's growth between two looks: at 8 MiB a program growing a MiB of
/// small allocations every 40 ms under `--mem 64M` peaked at 65.2-65.7 MiB
/// (`tests/run.rs`), at 16 MiB within it.
const OWN_BUFFERS_BYTES: u64 = 16 << 20;
/// Budget changes smaller than this many pages are not passed on.
const STEP_MIN_PAGES: u64 = 64;

/// What the process holds outside the far region's `own_bytes` (mapped
/// pages, pool and reserve) now.
pub fn rest_bytes(own_bytes: u64) -> u64 {
    resident_bytes().saturating_sub(own_bytes)
}

/// This process's resident set, from /proc/self/statm (0 if unreadable,
/// which leaves the budget at its largest).
fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages = statm.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
    pages.unwrap_or(0) * PAGE_SIZE as u64
}

/// The far budget that keeps the process within `mem_bytes` when the rest
/// of it holds `rest_bytes`, and held `start_rest_bytes` at the start.
pub fn budget_bytes(mem_bytes: u64, rest_bytes: u64, start_rest_bytes: u64) -> u64 {
    let besides = besides_far_bytes(mem_bytes, rest_bytes, start_rest_bytes);
    mem_bytes.saturating_sub(besides).max(FLOOR_BYTES)
}

/// What LIMIT must leave besides the far pages: the rest of the process
/// (never less than at the start plus the connections' buffers) and the
/// slack.
fn besides_far_bytes(mem_bytes: u64, rest_bytes: u64, start_rest_bytes: u64) -> u64 {
    let rest = rest_bytes.max(start_rest_bytes + OWN_BUFFERS_BYTES);
    rest + (mem_bytes / SLACK_SHARE).max(SLACK_MIN_BYTES)
}

/// The far budget's floor (see the module doc).
const FLOOR_BYTES: u64 = (BUDGET_FLOOR_PAGES * PAGE_SIZE) as u64;

/// Follow the rest of the process for as long as it lives.
pub fn follow(heap: &'static Heap, mem_bytes: u64, start_rest_bytes: u64) {
    let spawned = std::thread::Builder::new().name("memlend-mem".into()).spawn(move || {
        let mut last_pages = 0;
        let mut warned = false;
        loop {
            let reserve_pages = heap.region.reserved_pages() as u64;
            let h = heap.region.handler_stats();
            let own_pages =
                heap.region.stats().pages_resident + h.pool_charged_pages + reserve_pages;
            let rest = rest_bytes(own_pages * PAGE_SIZE as u64);
            let budget = budget_bytes(mem_bytes, rest, start_rest_bytes);
            let pages = budget / PAGE_SIZE as u64;
            if budget <= FLOOR_BYTES && !warned {
                warned = true;
                tracing::warn!(
                    "--mem {} MiB is too small: besides its far pages the process needs {} MiB \
                     ({} MiB its own, the rest memlend's buffers and slack), and the far pages \
                     keep at least {} MiB, so the process may go over --mem",
                    mem_bytes >> 20,
                    besides_far_bytes(mem_bytes, rest, start_rest_bytes) >> 20,
                    rest >> 20,
                    FLOOR_BYTES >> 20
                );
            }
            if pages.abs_diff(last_pages) >= STEP_MIN_PAGES {
                heap.region.set_budget_pages(pages as usize);
                last_pages = pages;
            }
            std::thread::sleep(INTERVAL);
        }
    });
    if let Err(e) = spawned {
        tracing::error!(
            "--mem: cannot follow the process's memory ({e}); the far budget stays fixed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_the_limit_less_the_rest_and_the_slack() {
        let mib = |m: u64| m << 20;
        // The rest is above its floor: 128 - 20 - 4 (a 32nd) = 104.
        assert_eq!(budget_bytes(mib(128), mib(20), mib(1)), mib(104));
        // The rest is below the start plus the connections' buffers.
        assert_eq!(budget_bytes(mib(128), mib(2), mib(1)), mib(128 - 17 - 4));
        // Never below the floor at which every instruction can progress.
        assert_eq!(budget_bytes(mib(8), mib(100), 0), FLOOR_BYTES);
        assert_eq!(budget_bytes(mib(32), mib(14), mib(13)), FLOOR_BYTES);
    }
}
