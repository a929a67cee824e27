//! When a donor reclaims a lease, move that lease's pages elsewhere before
//! the deadline — to a new lease if the cluster has one, else home (the SSD
//! tier if configured, else local RAM) — then release it. The program keeps
//! running throughout; `Relocatable` keeps every page readable and every
//! write kept while pages move. A lease lost with no other copy gets a
//! stand-in that fails its pages' reads and keeps new writes at home.

use super::Agent;
use memlend_store::layer::relocate::{self, Progress, RelocateOptions};
use memlend_store::layer::Lost;
use memlend_store::PAGE_SIZE;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Agent {
    pub(super) fn reclaim(&mut self, donor: u64, lease: u64, deadline_ms: u64) {
        let Some(i) = self.roster.find(donor, lease) else {
            return self.daemon.release(donor, lease);
        };
        let start = Instant::now();
        let deadline = start + Duration::from_millis(deadline_ms);
        let pages = self.roster.members[i].pages;
        let from = self.roster.members[i].donor_name.clone();
        tracing::info!(%from, lease, pages, deadline_ms, "reclaimed: moving the lease's pages");
        let wait = Duration::from_millis(deadline_ms / 4).min(Duration::from_secs(5));
        let (target, to, new_lease) = match self.replacement(i, wait) {
            Some((store, g)) => (store, g.donor_name.clone(), Some((g.donor, g.lease))),
            None => match self.slabs.home_store(pages) {
                Ok((s, name)) => (s, name, None),
                Err(e) => {
                    tracing::error!(error = %e, "no place to move reclaimed pages to");
                    return;
                }
            },
        };
        // Big batches: each costs one round trip to the donor (the remote
        // store pipelines its pieces), so 4 MiB batches keep a 40 ms link
        // busy where 256 KiB ones moved 3 MB/s. Writers to a batch's pages
        // wait for it, a few ms on a LAN.
        let opts =
            RelocateOptions { deadline: Some(deadline), batch_pages: relocate::BATCH_PAGES_MAX };
        let progress = |p: Progress| {
            if p.pages_copied.is_multiple_of(16_384) || p.pages_copied == p.pages_total {
                tracing::info!(copied = p.pages_copied, total = p.pages_total, "moving pages");
            }
        };
        match self.roster.members[i].reloc.relocate(target, opts, &progress) {
            Ok(_) => {
                self.daemon.release(donor, lease);
                let m = &mut self.roster.members[i];
                m.lease = new_lease;
                m.donor_name = to.clone();
                if new_lease.is_none() {
                    self.back_to_lease.soon();
                }
                let ms = start.elapsed().as_millis();
                tracing::info!(%from, %to, pages, ms, "moved a reclaimed lease");
                eprintln!(
                    "memlend: donor {from} reclaimed {} MiB; moved to {to} in {ms} ms",
                    (pages * PAGE_SIZE as u64) >> 20
                );
            }
            Err(e) => {
                tracing::error!(error = %e, %from, "could not move a reclaimed lease before its deadline");
                if let Some((d, l)) = new_lease {
                    self.daemon.release(d, l);
                }
            }
        }
    }

    /// A lease with no other copy is gone: its pages now fail at once when
    /// read (SIGBUS at the page, not a retry against a slab that no longer
    /// exists), and new writes go home, so eviction keeps working.
    pub(super) fn lost(&mut self, donor: u64, lease: u64, why: &str) {
        tracing::error!(donor, lease, %why, "a lease was lost: its pages can no longer be read");
        let Some(i) = self.roster.find(donor, lease) else { return };
        let m = &mut self.roster.members[i];
        let why = format!("lease {lease} from {} was lost ({why})", m.donor_name);
        let home = match self.slabs.home_store(m.pages) {
            Ok((s, _)) => s,
            Err(e) => return tracing::error!(error = %e, "no home for a lost lease's new writes"),
        };
        let stand_in = Lost::new(home, m.pages, &why).map_err(anyhow::Error::from);
        match stand_in.and_then(|l| Ok(m.reloc.replace(Arc::new(l))?)) {
            Ok(_gone) => {
                m.lease = None;
                m.may_return = false;
                eprintln!("memlend: {why}: reading one of its {} pages now raises SIGBUS", m.pages);
            }
            Err(e) => tracing::error!(error = %e, "cannot stand in for a lost lease"),
        }
    }
}
