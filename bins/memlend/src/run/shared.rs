//! `memlend run`'s shared-memory server: the program's shared anonymous
//! mappings (PostgreSQL's shared buffers) are far, served here, in this
//! process, which outlives every process of the program
//! (`memlend_fault::shmem`). Its budget: `--local` as given, or under
//! `--mem` what the memory cgroup leaves of LIMIT once everything else it
//! is charged is counted, looked at every `INTERVAL`.

use anyhow::{Context, Result};
use memlend_borrow::Placement;
use memlend_fault::shmem::{Server, ServerConfig, SharedStats};
use memlend_fault::BUDGET_FLOOR_PAGES;
use memlend_host::charge::Charge;
use memlend_store::PAGE_SIZE;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const INTERVAL: Duration = Duration::from_millis(50);
/// Kept free of LIMIT for what moves between two looks: a 16th, at least
/// 8 MiB. The shim's 32nd and 4 MiB (`mem_limit.rs`) let a Python program
/// whose three forked children fault shared pages as fast as they can be
/// placed get OOM-killed in a 64 MiB cgroup.
const SLACK_SHARE: u64 = 16;
const SLACK_MIN_BYTES: u64 = 8 << 20;
/// The rest (everything but the shared pages) is taken as the largest of
/// the last this many looks (a second): a rise at once, a fall only once
/// it lasts, as the shim takes it.
const REST_HOLD_LOOKS: usize = 20;
/// The cgroup's inactive page cache counted as charged up to this much
/// (the program's code pages, dropped, are read again).
const FILE_COUNTED_BYTES: u64 = 16 << 20;

/// What limits the resident shared pages.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    /// `--local`: this many bytes.
    Fixed(u64),
    /// `--mem LIMIT`: what the memory cgroup leaves of LIMIT; with no
    /// memory cgroup, half of LIMIT.
    Mem(u64),
}

pub struct Shared {
    server: Server,
    stop: Arc<AtomicBool>,
    follow: Option<JoinHandle<()>>,
    peak_resident: Arc<AtomicU64>,
}

/// What the server did, for the summary.
pub struct Summary {
    pub segments: u64,
    pub bytes: u64,
    pub refused: u64,
    pub evicted_pages: u64,
    pub store_reads: u64,
    pub zero_fills: u64,
    pub peak_resident_bytes: u64,
    pub brought_home: u64,
    pub poisoned: u64,
}

/// Serve at `sock`, with stores opened as `placement` says.
pub fn start(sock: &Path, placement: &Placement, budget: Budget) -> Result<Shared> {
    let first = match budget {
        Budget::Fixed(bytes) => bytes,
        Budget::Mem(limit) => limit / 2,
    };
    let budget_pages = Arc::new(AtomicU64::new(pages(first)));
    let placement = placement.clone();
    let me = std::process::id();
    let config = ServerConfig {
        accept_peer: Box::new(move |pid| descends_from(pid, me)),
        budget_pages: Arc::clone(&budget_pages),
        open_store: Box::new(move |pages| {
            let opened = placement.open(Some(pages)).map_err(|e| format!("{e:#}"))?;
            tracing::info!(pages, "shared segment's store on {}", opened.describe);
            Ok(opened.store)
        }),
    };
    let server = Server::start(sock, config)
        .with_context(|| format!("shared-memory server at {}", sock.display()))?;
    // Open to every user, as a program may become another (PostgreSQL's
    // server runs as its own user); the server serves only descendants.
    std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o666))?;
    let stop = Arc::new(AtomicBool::new(false));
    let peak_resident = Arc::new(AtomicU64::new(0));
    let follow = {
        let (stop, stats, peak) =
            (Arc::clone(&stop), Arc::clone(&server.stats), Arc::clone(&peak_resident));
        std::thread::Builder::new()
            .name("memlend-shared-budget".into())
            .spawn(move || follow(budget, &budget_pages, &stats, &peak, &stop))?
    };
    Ok(Shared { server, stop, follow: Some(follow), peak_resident })
}

/// The most parents walked up from a process to find this one.
const ANCESTORS_MAX: usize = 64;

/// Is `pid` a descendant of `ancestor` (its child, grandchild, ...)?
fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut at = pid;
    for _ in 0..ANCESTORS_MAX {
        match parent_of(at) {
            Some(p) if p == ancestor => return true,
            Some(p) if p > 1 => at = p,
            _ => return false,
        }
    }
    false
}

/// The parent in `/proc/PID/stat`: the field after the command, which is
/// in parentheses and may itself hold spaces and parentheses.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

fn pages(bytes: u64) -> u64 {
    (bytes / PAGE_SIZE as u64).max(BUDGET_FLOOR_PAGES as u64)
}

/// Every INTERVAL: the budget under `--mem`, and the peak resident.
fn follow(
    budget: Budget,
    pages_now: &AtomicU64,
    stats: &SharedStats,
    peak: &AtomicU64,
    stop: &AtomicBool,
) {
    let charge = Charge::of_self();
    let mut rests = std::collections::VecDeque::with_capacity(REST_HOLD_LOOKS);
    while !stop.load(Relaxed) {
        let resident = SharedStats::get(&stats.resident_pages);
        peak.fetch_max(resident, Relaxed);
        if let (Budget::Mem(mem), Some(charge)) = (budget, charge.as_ref()) {
            if let Some((limit, rest)) = limit_and_rest(mem, charge, resident) {
                if rests.len() == REST_HOLD_LOOKS {
                    rests.pop_front();
                }
                rests.push_back(rest);
                let held = rests.iter().copied().max().unwrap_or(rest);
                pages_now.store(pages(budget_bytes(limit, held)), Relaxed);
            }
        }
        std::thread::sleep(INTERVAL);
    }
}

/// LIMIT (the cgroup's, if lower), and the rest: everything the cgroup is
/// charged besides the shared pages, counted as the shim counts a process's
/// own memory (inactive page cache past FILE_COUNTED_BYTES gives way) but
/// with dirty page cache counted: the server writes its victims through the
/// page cache of an `--ssd` file as fast as it fills the segment. Letting
/// all clean page cache give way, active too, gave PostgreSQL's buffers
/// more room but got a Python program OOM-killed in a 64 MiB cgroup
/// (docs/notebook/2026-11-29-shared-memory.md). None: unreadable.
fn limit_and_rest(mem: u64, charge: &Charge, resident_pages: u64) -> Option<(u64, u64)> {
    let limit = charge.limit_bytes().map_or(mem, |l| l.min(mem));
    let charged = charge.charged_bytes_counting_dirty(FILE_COUNTED_BYTES)?;
    Some((limit, charged.saturating_sub(resident_pages * PAGE_SIZE as u64)))
}

/// What LIMIT leaves the shared pages once the slack and the rest are out.
fn budget_bytes(limit: u64, rest: u64) -> u64 {
    let slack = (limit / SLACK_SHARE).max(SLACK_MIN_BYTES);
    limit.saturating_sub(slack).saturating_sub(rest)
}

impl Shared {
    /// Stop serving (the program has ended; a segment still mapped by a
    /// process it left behind comes home first) and sum up.
    pub fn finish(mut self) -> Summary {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.follow.take() {
            let _ = t.join();
        }
        let s = Arc::clone(&self.server.stats);
        let peak = self.peak_resident.load(Relaxed).max(SharedStats::get(&s.resident_pages));
        self.server.stop();
        let get = SharedStats::get;
        Summary {
            segments: get(&s.segments_taken),
            bytes: get(&s.segment_bytes),
            refused: get(&s.segments_refused),
            evicted_pages: get(&s.evicted_pages),
            store_reads: get(&s.store_reads),
            zero_fills: get(&s.zero_fills),
            peak_resident_bytes: peak * PAGE_SIZE as u64,
            brought_home: get(&s.brought_home),
            poisoned: get(&s.pages_poisoned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_limit_less_slack_and_rest() {
        assert_eq!(budget_bytes(256 << 20, 100 << 20), (256 - 16 - 100) << 20);
        assert_eq!(budget_bytes(64 << 20, 20 << 20), (64 - 8 - 20) << 20);
        assert_eq!(budget_bytes(64 << 20, 80 << 20), 0);
    }

    #[test]
    fn a_child_descends_and_a_stranger_does_not() {
        let child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let me = std::process::id();
        assert!(descends_from(child.id(), me));
        assert!(!descends_from(me, child.id()));
        assert!(!descends_from(1, me));
        let mut child = child;
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_budget_never_goes_below_the_floor() {
        assert_eq!(pages(0), BUDGET_FLOOR_PAGES as u64);
        assert_eq!(pages(64 << 20), (64 << 20) / 4096);
    }
}
