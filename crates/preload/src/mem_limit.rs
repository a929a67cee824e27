//! `memlend run --mem LIMIT`: the whole process, far pages and everything
//! else, stays within LIMIT. The far budget is what the rest of the process
//! leaves of it, followed every `INTERVAL` on a thread of its own.
//!
//! "The rest" is the resident set (`/proc/self/statm`) less the region's
//! mapped pages and its compressed pool. Staging and prefetch buffers are
//! part of the budget but stay in "the rest" here, so the estimate errs low
//! by what they hold (at most the region's reserved pages). The rest is
//! never taken as less than it was at the start plus `OWN_BUFFERS_BYTES`:
//! the store connections' buffers grow only once pages move, and a 64 MiB
//! limit peaked at 69.5 MiB while they grew between two looks.

use crate::far::Heap;
use memlend_store::PAGE_SIZE;
use std::time::Duration;

const INTERVAL: Duration = Duration::from_millis(50);
/// Kept free of LIMIT for what a memory cgroup counts and the resident set
/// does not (page tables, kernel buffers): a 32nd, at least 4 MiB.
const SLACK_SHARE: u64 = 32;
const SLACK_MIN_BYTES: u64 = 4 << 20;
/// What memlend's own store connections hold once pages move: four of
/// them (a fault's, three prefetch readers') at about 3.4 MiB each,
/// measured in /proc/PID/smaps with one donor.
const OWN_BUFFERS_BYTES: u64 = 16 << 20;
/// Budget changes smaller than this many pages are not passed on.
const STEP_MIN_PAGES: u64 = 64;

/// What the process holds outside far memory now, to be told apart from
/// what it held at the start.
pub fn rest_bytes(far_bytes: u64) -> u64 {
    resident_bytes().saturating_sub(far_bytes)
}

/// The far budget that keeps the process within `mem_bytes` when the rest
/// of it holds `rest_bytes`, and held `start_rest_bytes` at the start.
pub fn budget_bytes(mem_bytes: u64, rest_bytes: u64, start_rest_bytes: u64) -> u64 {
    let rest = rest_bytes.max(start_rest_bytes + OWN_BUFFERS_BYTES);
    let slack = (mem_bytes / SLACK_SHARE).max(SLACK_MIN_BYTES);
    mem_bytes.saturating_sub(rest).saturating_sub(slack).max(PAGE_SIZE as u64)
}

/// This process's resident set, from /proc/self/statm (0 if unreadable,
/// which leaves the budget at its largest).
fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages = statm.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
    pages.unwrap_or(0) * PAGE_SIZE as u64
}

/// Follow the rest of the process for as long as it lives.
pub fn follow(heap: &'static Heap, mem_bytes: u64, start_rest_bytes: u64) {
    let spawned = std::thread::Builder::new().name("memlend-mem".into()).spawn(move || {
        let mut last_pages = 0;
        loop {
            let h = heap.region.handler_stats();
            let far_pages = heap.region.stats().pages_resident + h.pool_charged_pages;
            let rest = rest_bytes(far_pages * PAGE_SIZE as u64);
            let budget = budget_bytes(mem_bytes, rest, start_rest_bytes);
            let pages = budget / PAGE_SIZE as u64;
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
