//! Pages that went home go back to a lease when the cluster has room again.
//!
//! A reclaim with no other donor free moves a lease's pages home: to the
//! SSD directory, or else into this node's own RAM, which is what far
//! memory was to spare. A segment that found no lease when the region grew
//! lives in the SSD directory. Neither should stay there for good. So the
//! lease thread asks now and then for a lease the size of one such member,
//! and moves its pages there while the program runs (`Relocatable`, as a
//! reclaim does). Refused, it asks less often: 5 s after going home, then
//! doubling to 2 min, so a cluster without room hears one small ask a
//! while. A lost lease's stand-in never moves (its pages are gone), nor does
//! a segment at home under `--redundancy ssd` (it has no SSD copy above
//! it; on the SSD it needs none). What waits at home is reported to the
//! daemon (`Ask::Home`) as demand, so the node stays a client meanwhile
//! rather than flickering to neutral between two asks.

use super::Agent;
use memlend_pool::api::Ask;
use memlend_store::layer::relocate::{self, RelocateOptions};
use memlend_store::PAGE_SIZE;
use std::time::{Duration, Instant};

/// The first wait before asking for a lease for pages at home.
pub(crate) const RETURN_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between two asks.
const RETURN_MAX: Duration = Duration::from_secs(120);
/// How long an ask waits for a grant.
const GRANT_WAIT: Duration = Duration::from_secs(2);
/// A move back gives up after this (the old place keeps every page). The
/// lease thread is busy meanwhile: a reclaim heard then waits for it.
const MOVE_DEADLINE: Duration = Duration::from_secs(20);

/// When the lease thread next asks, and how long it waits after a refusal.
pub(crate) struct BackToLease {
    pub(crate) next: Instant,
    pub(crate) pause: Duration,
    /// Bytes at home the daemon was last told of.
    reported: u64,
}

impl BackToLease {
    pub(crate) fn new() -> BackToLease {
        BackToLease { next: Instant::now() + RETURN_FIRST, pause: RETURN_FIRST, reported: 0 }
    }

    /// Something just went home: ask soon, whatever the backoff was.
    pub(crate) fn soon(&mut self) {
        self.pause = RETURN_FIRST;
        self.next = self.next.min(Instant::now() + RETURN_FIRST);
    }

    fn refused(&mut self) {
        self.pause = (self.pause * 2).min(RETURN_MAX);
        self.next = Instant::now() + self.pause;
    }
}

impl Agent {
    /// Tell the daemon how much waits at home, when that changed: it is
    /// demand (the node is a client while it lasts), not a passing ask.
    pub(crate) fn report_home(&mut self) {
        let bytes = self.roster.waiting_home_bytes();
        if bytes != self.back_to_lease.reported {
            self.back_to_lease.reported = bytes;
            self.daemon.ask(&Ask::Home { bytes });
        }
    }

    /// If it is time, move one member at home back to a new lease.
    pub(crate) fn bring_back(&mut self) {
        if Instant::now() < self.back_to_lease.next {
            return;
        }
        let Some((i, _)) = self.roster.waiting_home().next() else {
            self.back_to_lease.next = Instant::now() + RETURN_MAX;
            return;
        };
        let pages = self.roster.members[i].pages;
        let Some((target, g)) = self.replacement(i, GRANT_WAIT) else {
            return self.back_to_lease.refused();
        };
        let start = Instant::now();
        let opts = RelocateOptions {
            deadline: Some(start + MOVE_DEADLINE),
            batch_pages: relocate::BATCH_PAGES_MAX,
        };
        let from = self.roster.members[i].donor_name.clone();
        match self.roster.members[i].reloc.relocate(target, opts, &|_| {}) {
            Ok(_) => {
                let m = &mut self.roster.members[i];
                m.lease = Some((g.donor, g.lease));
                m.donor_name = g.donor_name.clone();
                let ms = start.elapsed().as_millis();
                tracing::info!(%from, to = %g.donor_name, pages, ms, "moved pages back to a lease");
                eprintln!(
                    "memlend: {} MiB moved back from {from} to {} in {ms} ms",
                    (pages * PAGE_SIZE as u64) >> 20,
                    g.donor_name
                );
                // More may be waiting: look again at once.
                self.back_to_lease.next = Instant::now();
                self.back_to_lease.pause = RETURN_FIRST;
            }
            Err(e) => {
                tracing::warn!(error = %e, %from, "could not move pages back to a lease");
                self.daemon.release(g.donor, g.lease);
                self.back_to_lease.refused();
            }
        }
    }
}
