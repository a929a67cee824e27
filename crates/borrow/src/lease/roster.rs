//! The region's members: each lease (or home store) that holds pages of
//! one of its segments, with what the daemon needs to hear of them.

use super::daemon::Daemon;
use memlend_pool::api::Ask;
use memlend_pool::engine::AVOID_NODES_MAX;
use memlend_store::layer::relocate::Relocatable;
use memlend_store::layer::Stats;
use memlend_store::{PageStore, PAGE_SIZE};
use std::sync::Arc;
use std::time::Duration;

/// One lease (or a home store) inside the region.
pub struct Member {
    /// `(donor, lease)`; `None` once the pages moved home.
    pub lease: Option<(u64, u64)>,
    pub donor_name: String,
    pub pages: u64,
    pub reloc: Arc<Relocatable>,
    pub stats: Arc<Stats<Arc<Relocatable>>>,
    /// At home, it may go back to a lease (`back_to_lease.rs`).
    pub may_return: bool,
    /// The segment of the region it holds pages of (`grow.rs`).
    pub segment: usize,
}

pub fn member(
    lease: Option<(u64, u64)>,
    donor_name: &str,
    store: Arc<dyn PageStore>,
    segment: usize,
) -> Member {
    let pages = store.info().pages;
    let reloc = Arc::new(Relocatable::new(store));
    let stats = Arc::new(Stats::new(Arc::clone(&reloc)));
    let donor_name = donor_name.to_string();
    Member { lease, donor_name, pages, reloc, stats, may_return: true, segment }
}

/// The members, and each one's page count at the last activity report.
pub(crate) struct Roster {
    pub(crate) members: Vec<Member>,
    pages_at_last_report: Vec<u64>,
}

impl Roster {
    pub(crate) fn new(members: Vec<Member>) -> Roster {
        let pages_at_last_report = vec![0; members.len()];
        Roster { members, pages_at_last_report }
    }

    pub(crate) fn add(&mut self, m: Member) {
        self.members.push(m);
        self.pages_at_last_report.push(0);
    }

    /// The member holding lease `lease` of `donor`.
    pub(crate) fn find(&self, donor: u64, lease: u64) -> Option<usize> {
        self.members.iter().position(|m| m.lease == Some((donor, lease)))
    }

    /// Members at home that may go back to a lease.
    pub(crate) fn waiting_home(&self) -> impl Iterator<Item = (usize, &Member)> {
        self.members.iter().enumerate().filter(|(_, m)| m.lease.is_none() && m.may_return)
    }

    pub(crate) fn waiting_home_bytes(&self) -> u64 {
        self.waiting_home().map(|(_, m)| m.pages * PAGE_SIZE as u64).sum()
    }

    /// The donors of `segment`'s leases (the reclaimed or failed one
    /// included), which a mirrored segment's new lease avoids.
    pub(crate) fn donors_of_segment(&self, segment: usize) -> Vec<u64> {
        let leases = self.members.iter().filter(|m| m.segment == segment);
        donors(leases)
    }

    /// Each lease's pages moved per second since the last report, to the
    /// daemon: a reclaim takes the least active lease first.
    pub(crate) fn report_activity(&mut self, daemon: &mut Daemon, every: Duration) {
        for (m, last) in self.members.iter().zip(self.pages_at_last_report.iter_mut()) {
            let snap = m.stats.snapshot();
            let pages = snap.read.pages + snap.write.pages;
            let rate = pages.saturating_sub(*last) / every.as_secs().max(1);
            *last = pages;
            if let Some((donor, lease)) = m.lease {
                let pages_per_s = rate.min(u32::MAX as u64) as u32;
                daemon.ask(&Ask::Activity { donor, lease, pages_per_s });
            }
        }
    }
}

/// The distinct donors of `members`' leases, at most `AVOID_NODES_MAX`.
pub(crate) fn donors<'a>(members: impl Iterator<Item = &'a Member>) -> Vec<u64> {
    let mut v: Vec<u64> = members.filter_map(|m| m.lease.map(|(donor, _)| donor)).collect();
    v.sort_unstable();
    v.dedup();
    v.truncate(AVOID_NODES_MAX);
    v
}
