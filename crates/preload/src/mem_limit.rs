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
//! its compressed pool, and what the handler's buffers hold now (staged
//! victims, prefetch windows). The budget keeps a reserve for those buffers
//! out of the mapped pages (`reserve.rs`), so mapped pages, pool, reserve
//! and the rest stay within LIMIT less the slack even when the buffers
//! fill. Subtracting the whole reserve instead (room included) let the
//! budget grow by its empty part, and a redis whose batch had grown to
//! 1024 pages had 8 MiB of room it could fill past LIMIT. (Leaving what
//! the buffers hold in the rest counts it twice: with a fixed 14 MiB
//! reserve a redis under `--mem 128M` peaked at 112 MiB.) The
//! rest is never taken as less than it was at the start plus
//! `OWN_BUFFERS_BYTES`, for the store connections' buffers that grow only
//! once pages move. The far budget never goes below the region's
//! `BUDGET_FLOOR_PAGES` (1 MiB), with which every instruction can progress:
//! a LIMIT too small for the rest of the process is then exceeded, with a
//! warning, rather than the program stalling.
//!
//! Inside a memory cgroup whose limit is at most LIMIT (a container, a
//! systemd unit, a benchmark's memcg), that limit is what binds, and what
//! the kernel holds to it is the cgroup's charge, not the resident set:
//! shared files another cgroup paid for are in the resident set and not in
//! the charge, page tables and socket buffers the other way round. There
//! the rest is the cgroup's charge (less inactive page cache past
//! `FILE_COUNTED_BYTES`, which reclaim drops) less the region's own, and
//! LIMIT is the cgroup's limit. The floor for the connections' buffers
//! holds until pages have moved both ways (`WARM_PAGES`); after that the
//! charge holds them. Growth into free
//! room is split among the cgroup's processes, so that two of them do not
//! both take it. (Redis under `--mem 128M` in a 128 MiB memcg was charged
//! 113-117 MiB by the resident-set rule, with 94 MiB far: it counted 5 MiB
//! of shared libraries the memcg did not charge, and the floor.)
//!
//! A fork (`fork/`) holds room for the child for two seconds: the budget
//! is that much lower, from before the fork, until the child's own charge
//! shows in the cgroup's.
//!
//! The rest is a difference of two samples taken at slightly different
//! moments (the resident set or charge now, the region's own as of the
//! handler's last turn), and a miss-timed pair reads it low: a program
//! growing steadily under `--mem 64M` once read 4 MiB less rest than the
//! look before, its budget rose by as much, and it peaked at 64.6-65.3 MiB
//! in one run of 15. So a rise of the rest is taken at once and a fall only
//! once it has lasted `REST_HOLD_LOOKS` looks: the budget follows the
//! largest rest of the last second.

use crate::heap::Heap;
use memlend_fault::BUDGET_FLOOR_PAGES;
use memlend_host::charge::Charge;
use memlend_store::PAGE_SIZE;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const INTERVAL: Duration = Duration::from_millis(50);
/// The cgroup is looked up again every this many looks, in case the
/// process was moved.
const CGROUP_LOOK_EVERY: u32 = 20;
/// Kept free of LIMIT for what a memory cgroup counts and the resident set
/// does not (page tables, kernel buffers), and for growth between two
/// looks: a 32nd, at least 4 MiB.
const SLACK_SHARE: u64 = 32;
const SLACK_MIN_BYTES: u64 = 4 << 20;
/// What memlend's own store connections hold once pages move, and the
/// rest's growth between two looks: at 8 MiB a program growing a MiB of
/// small allocations every 40 ms under `--mem 64M` peaked at 65.2-65.7 MiB
/// (`tests/run.rs`), at 16 MiB within it.
const OWN_BUFFERS_BYTES: u64 = 16 << 20;
/// Pages read from and written to the store after which the connections'
/// buffers have grown, so that a cgroup's charge holds them.
const WARM_PAGES: u64 = 1024;
/// Inactive page cache in a cgroup counted as charged all the same; only
/// what is beyond it is left to reclaim. Redis in a 128 MiB memcg held
/// 2-4 MiB of it (its code and libraries' cold pages): with all of it left
/// to reclaim, the memcg sat within 2 MiB of its limit and hit it 400-1800
/// times in two runs of three, the kernel dropping those pages each time.
const FILE_COUNTED_BYTES: u64 = 4 << 20;
/// Looks over which the largest rest is taken (a second).
const REST_HOLD_LOOKS: usize = 20;
/// Budget changes smaller than this many pages are not passed on.
const STEP_MIN_PAGES: u64 = 64;

/// The limit of the cgroup `--mem` follows; 0 while it follows the
/// resident set. For the exit report.
pub static CGROUP_LIMIT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Under `--mem`, how long the room made at a fork is held. The child fills
/// its budget within about this; from then on the `--mem` follower sees the
/// child's charge, and room held on top of it took the parent's memory
/// twice (held for the child's whole life: the parent served 0.69-0.81x
/// swap to disk's operations during a BGSAVE, `fork_bgsave5.json`).
const ROOM_HOLD: Duration = Duration::from_secs(2);

/// Under `--mem`, room held for children forked lately: (until, bytes).
/// Forks are one at a time and each entry lives `ROOM_HOLD`, so it stays
/// short.
static ROOMS: Mutex<Vec<(Instant, u64)>> = Mutex::new(Vec::new());

/// The room children forked lately hold: the parent's far budget is that
/// much lower, from before the fork itself.
pub fn children_room_bytes() -> u64 {
    let now = Instant::now();
    let mut rooms = ROOMS.lock().unwrap_or_else(|e| e.into_inner());
    rooms.retain(|&(until, _)| until > now);
    rooms.iter().map(|&(_, bytes)| bytes).sum()
}

/// A child was forked: its room, `bytes`, is held for `ROOM_HOLD`.
pub fn hold_for_child(bytes: u64) {
    let mut rooms = ROOMS.lock().unwrap_or_else(|e| e.into_inner());
    rooms.retain(|&(until, _)| until > Instant::now());
    rooms.push((Instant::now() + ROOM_HOLD, bytes));
}

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
    rest + slack_bytes(mem_bytes)
}

fn slack_bytes(mem_bytes: u64) -> u64 {
    (mem_bytes / SLACK_SHARE).max(SLACK_MIN_BYTES)
}

/// The far budget's floor (see the module doc).
const FLOOR_BYTES: u64 = (BUDGET_FLOOR_PAGES * PAGE_SIZE) as u64;

/// The budget to start with: by the resident set, and within a binding
/// cgroup's limit too.
pub fn start_budget_bytes(mem_bytes: u64, start_rest_bytes: u64) -> u64 {
    let by_resident = budget_bytes(mem_bytes, start_rest_bytes, start_rest_bytes);
    let charged = binding_cgroup(mem_bytes)
        .and_then(|(cg, limit)| Some((cg.charged_bytes(FILE_COUNTED_BYTES)?, limit)));
    match charged {
        Some((charged, limit)) => by_resident.min(budget_bytes(limit, charged, charged)),
        None => by_resident,
    }
}

/// This process's memory cgroup and its limit, if that limit is at most
/// `mem_bytes` (then it is the one that binds).
fn binding_cgroup(mem_bytes: u64) -> Option<(Charge, u64)> {
    let cg = Charge::of_self()?;
    let limit = cg.limit_bytes().filter(|&l| l <= mem_bytes)?;
    Some((cg, limit))
}

/// One look at a binding cgroup, and the far budget it gives.
pub struct CgroupLook {
    pub limit_bytes: u64,
    pub charged_bytes: u64,
    /// The region's own: mapped pages, pool, what its buffers hold.
    pub own_bytes: u64,
    /// The least the rest is taken as (see the module doc).
    pub rest_floor_bytes: u64,
    pub procs: u64,
    pub budget_now_bytes: u64,
}

impl CgroupLook {
    /// The limit less `rest_bytes` (the largest rest of late) and the
    /// slack; a rise moves a share of the way per process in the cgroup, a
    /// fall all of it at once.
    pub fn budget_bytes(&self, rest_bytes: u64) -> u64 {
        let target = mem_less(self.limit_bytes, rest_bytes);
        let next = match target.checked_sub(self.budget_now_bytes) {
            Some(rise) => self.budget_now_bytes + rise / self.procs.max(1),
            None => target,
        };
        next.max(FLOOR_BYTES)
    }

    /// The rest by this look alone.
    pub fn rest_bytes(&self) -> u64 {
        self.charged_bytes.saturating_sub(self.own_bytes).max(self.rest_floor_bytes)
    }
}

fn mem_less(mem_bytes: u64, rest_bytes: u64) -> u64 {
    mem_bytes.saturating_sub(rest_bytes + slack_bytes(mem_bytes))
}

/// The cgroup `--mem` follows.
struct Bound {
    charge: Charge,
    limit_bytes: u64,
    start_rest_bytes: u64,
}

/// Follows the rest of the process for as long as it lives.
struct Follower {
    heap: &'static Heap,
    mem_bytes: u64,
    start_rest_bytes: u64,
    bound: Option<Bound>,
    warm: bool,
    looks: u32,
    rests: RecentMax,
    last_pages: u64,
    warned: bool,
}

/// The largest of the last `REST_HOLD_LOOKS` values pushed.
struct RecentMax {
    values: [u64; REST_HOLD_LOOKS],
    next: usize,
}

impl RecentMax {
    fn new() -> RecentMax {
        RecentMax { values: [0; REST_HOLD_LOOKS], next: 0 }
    }

    /// Push `value`; the largest of the window, `value` included.
    fn push(&mut self, value: u64) -> u64 {
        self.values[self.next] = value;
        self.next = (self.next + 1) % REST_HOLD_LOOKS;
        self.values.iter().copied().max().unwrap_or(value)
    }
}

impl Follower {
    fn look(&mut self) {
        if self.looks.is_multiple_of(CGROUP_LOOK_EVERY) {
            self.find_cgroup();
        }
        self.looks = self.looks.wrapping_add(1);
        let s = self.heap.region.stats();
        self.warm |= s.faults_from_store >= WARM_PAGES && s.pages_written_back >= WARM_PAGES;
        let own = self.own_bytes();
        let budget_now_pages = self.heap.region.handler_stats().budget_pages;
        let (limit, rest, budget) = match self.cgroup_look(own, budget_now_pages) {
            Some(look) => {
                let rest = self.rests.push(look.rest_bytes());
                (look.limit_bytes, rest, look.budget_bytes(rest))
            }
            None => {
                let rest = self.rests.push(rest_bytes(own));
                (self.mem_bytes, rest, budget_bytes(self.mem_bytes, rest, self.start_rest_bytes))
            }
        };
        // Room held for forked children while they live (`hold_for_child`).
        let children = children_room_bytes();
        let budget = budget.saturating_sub(children).max(FLOOR_BYTES);
        if budget <= FLOOR_BYTES {
            self.warn_once(limit, rest);
        }
        let pages = budget / PAGE_SIZE as u64;
        if pages.abs_diff(self.last_pages) >= STEP_MIN_PAGES {
            self.heap.region.set_budget_pages(pages as usize);
            self.last_pages = pages;
        }
    }

    /// The region's own: mapped pages, pool and what the buffers hold, as
    /// of the handler's last turn.
    fn own_bytes(&self) -> u64 {
        let region = &self.heap.region;
        let pages = region.stats().pages_resident
            + region.handler_stats().pool_charged_pages
            + region.reserve_held_pages() as u64;
        pages * PAGE_SIZE as u64
    }

    /// A look at the bound cgroup; None if there is none or its charge
    /// cannot be read (the resident set is followed then).
    fn cgroup_look(&self, own_bytes: u64, budget_now_pages: u64) -> Option<CgroupLook> {
        let b = self.bound.as_ref()?;
        Some(CgroupLook {
            limit_bytes: b.limit_bytes,
            charged_bytes: b.charge.charged_bytes(FILE_COUNTED_BYTES)?,
            own_bytes,
            rest_floor_bytes: if self.warm { 0 } else { b.start_rest_bytes + OWN_BUFFERS_BYTES },
            procs: b.charge.procs() as u64,
            budget_now_bytes: budget_now_pages * PAGE_SIZE as u64,
        })
    }

    fn find_cgroup(&mut self) {
        let found = binding_cgroup(self.mem_bytes);
        let same = matches!((&found, &self.bound), (Some((c, _)), Some(b)) if *c == b.charge);
        if !same {
            let own = self.own_bytes();
            self.rests = RecentMax::new();
            self.bound = found.and_then(|(charge, limit_bytes)| {
                let start_rest_bytes =
                    charge.charged_bytes(FILE_COUNTED_BYTES)?.saturating_sub(own);
                tracing::info!(
                    "--mem: following memory cgroup {}'s charge against its limit of {} MiB",
                    charge.dir().display(),
                    limit_bytes >> 20
                );
                Some(Bound { charge, limit_bytes, start_rest_bytes })
            });
        }
        let limit = self.bound.as_ref().map_or(0, |b| b.limit_bytes);
        CGROUP_LIMIT_BYTES.store(limit, Relaxed);
    }

    fn warn_once(&mut self, limit_bytes: u64, rest_bytes: u64) {
        if std::mem::replace(&mut self.warned, true) {
            return;
        }
        tracing::warn!(
            "--mem {} MiB is too small: besides its far pages the process needs {} MiB \
             ({} MiB its own, the rest memlend's buffers and slack), and the far pages \
             keep at least {} MiB, so the process may go over --mem",
            limit_bytes >> 20,
            (rest_bytes + slack_bytes(limit_bytes)) >> 20,
            rest_bytes >> 20,
            FLOOR_BYTES >> 20
        );
    }
}

/// Follow the rest of the process for as long as it lives.
pub fn follow(heap: &'static Heap, mem_bytes: u64, start_rest_bytes: u64) {
    let mut f = Follower {
        heap,
        mem_bytes,
        start_rest_bytes,
        bound: None,
        warm: false,
        looks: 0,
        rests: RecentMax::new(),
        last_pages: 0,
        warned: false,
    };
    let spawned = std::thread::Builder::new().name("memlend-mem".into()).spawn(move || loop {
        f.look();
        std::thread::sleep(INTERVAL);
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

    #[test]
    fn in_a_binding_cgroup_the_budget_follows_its_charge() {
        let mib = |m: u64| m << 20;
        let look = CgroupLook {
            limit_bytes: mib(128),
            charged_bytes: mib(117),
            own_bytes: mib(94),
            rest_floor_bytes: 0,
            procs: 1,
            budget_now_bytes: mib(94),
        };
        // The rest is 23 MiB of charge, the slack a 32nd: 128 - 23 - 4.
        assert_eq!(look.budget_bytes(look.rest_bytes()), mib(101));
        // Two processes in the cgroup: half the rise per look.
        let two = CgroupLook { procs: 2, ..look };
        assert_eq!(two.budget_bytes(two.rest_bytes()), mib(94) + mib(7) / 2);
        // A fall is taken whole, whatever the number of processes.
        let over = CgroupLook { charged_bytes: mib(130), procs: 4, ..look };
        assert_eq!(over.budget_bytes(over.rest_bytes()), mib(128 - 36 - 4));
        // Before the connections have warmed, the rest's floor holds.
        let cold = CgroupLook { rest_floor_bytes: mib(30), ..look };
        assert_eq!(cold.budget_bytes(cold.rest_bytes()), mib(128 - 30 - 4));
        // Never below the floor at which every instruction can progress.
        let full = CgroupLook { charged_bytes: mib(300), ..look };
        assert_eq!(full.budget_bytes(full.rest_bytes()), FLOOR_BYTES);
    }

    #[test]
    fn the_rest_rises_at_once_and_falls_after_a_second() {
        let mut rests = RecentMax::new();
        assert_eq!(rests.push(10), 10);
        assert_eq!(rests.push(30), 30);
        // A sample read low is not believed for a second.
        for _ in 0..REST_HOLD_LOOKS - 1 {
            assert_eq!(rests.push(26), 30);
        }
        assert_eq!(rests.push(26), 26);
        assert_eq!(rests.push(40), 40);
    }
}
