//! What the lease agent does with grants while the program runs: lease a
//! segment that is written to for the first time, or leased ahead
//! (`grow.rs`); and find one new lease to take a reclaimed lease's pages
//! or pages that wait at home.

use super::roster::member;
use super::{Agent, Grow};
use memlend_pool::api::LeaseGrant;
use memlend_store::layer::Concat;
use memlend_store::{PageStore, PAGE_SIZE};
use std::sync::Arc;
use std::time::Duration;

impl Agent {
    /// A new lease from the cluster for member `i`'s pages, if one comes
    /// within `wait`: away from the donors of its segment when the segment
    /// is mirrored.
    pub(crate) fn replacement(
        &mut self,
        i: usize,
        wait: Duration,
    ) -> Option<(Arc<dyn PageStore>, LeaseGrant)> {
        let pages = self.roster.members[i].pages;
        let avoid = self.avoid_for(self.roster.members[i].segment);
        let mut got = self.daemon.await_grants(pages * PAGE_SIZE as u64, wait, false, &avoid);
        // One lease that covers the member, or nothing: a member is one store.
        let fits = got.iter().position(|g| g.bytes >= pages * PAGE_SIZE as u64);
        let g = fits.map(|j| got.swap_remove(j));
        self.daemon.release_grants(&got);
        let g = g?;
        match super::slabs::open_lease(&g, &self.slabs.cfg, self.slabs.encrypt) {
            Ok(s) => Some((s, g)),
            Err(e) => {
                tracing::warn!(error = %e, "a replacement lease could not be opened");
                self.daemon.release(g.donor, g.lease);
                None
            }
        }
    }

    /// Lease segment `g.segment` and answer its writer. With no room in the
    /// cluster it goes to the SSD directory if there is one; else the writer
    /// hears why, and asks again later.
    pub(crate) fn grow(&mut self, g: Grow) {
        let answer = match self.segments.get(g.segment) {
            None => Err(format!("no segment {}", g.segment)),
            Some(Some(s)) => Ok(Arc::clone(s)),
            Some(None) => self.lease_segment(g.segment, g.pages),
        };
        if let Ok(s) = &answer {
            self.segments[g.segment] = Some(Arc::clone(s));
        }
        // A writer that gave up meanwhile asks again later and is answered
        // from `segments`: nothing is leased twice.
        let _ = g.reply.send(answer);
    }

    fn lease_segment(&mut self, segment: usize, pages: u64) -> Result<Arc<dyn PageStore>, String> {
        if let Some(asks) = self.mirror_asks.clone() {
            return self.lease_mirrored(segment, pages, asks);
        }
        let bytes = pages * PAGE_SIZE as u64;
        let grants = self.daemon.await_grants(bytes, super::grow::GROW_WAIT, true, &[]);
        let got: u64 = grants.iter().map(|g| g.bytes).sum();
        if got < bytes {
            self.daemon.release_grants(&grants);
            let lent = crate::human_pages(got / PAGE_SIZE as u64);
            let why = format!("the cluster lent {lent} of {}", crate::human_pages(pages));
            return self.segment_home(segment, pages, why);
        }
        let mut members = Vec::new();
        for g in &grants {
            match self.slabs.open_member(g, segment) {
                Ok(m) => members.push(m),
                Err(e) => {
                    self.daemon.release_grants(&grants);
                    return Err(format!(
                        "cannot open lease {} on {}: {e:#}",
                        g.lease, g.donor_name
                    ));
                }
            }
        }
        let stores: Vec<Arc<dyn PageStore>> = members.iter().map(|m| Arc::clone(&m.1)).collect();
        let store: Arc<dyn PageStore> = match stores.len() {
            1 => Arc::clone(&stores[0]),
            _ => Arc::new(Concat::new(stores).map_err(|e| e.to_string())?),
        };
        let names: Vec<&str> = grants.iter().map(|g| g.donor_name.as_str()).collect();
        tracing::info!(segment, pages, from = %names.join(", "), "leased a segment as the region filled");
        for (m, _) in members {
            self.roster.add(m);
        }
        Ok(store)
    }

    /// No lease for a segment: with an SSD directory it lives there (never
    /// reclaimed); without one the writer keeps its pages and asks again.
    fn segment_home(
        &mut self,
        segment: usize,
        pages: u64,
        why: String,
    ) -> Result<Arc<dyn PageStore>, String> {
        if self.slabs.home.is_none() {
            tracing::warn!(segment, %why, "no lease for a segment yet; its pages stay resident");
            return Err(why);
        }
        let (store, name) = self.slabs.home_store(pages).map_err(|e| format!("{why}; {e:#}"))?;
        tracing::warn!(segment, %why, to = %name, "a segment goes home: no lease");
        let mut m = member(None, &name, store, segment);
        // Under `--redundancy ssd` no SSD copy sits above it: a lease would
        // be its only home, so it stays on the SSD.
        m.may_return = !self.slabs.backed;
        let store = Arc::clone(&m.stats) as Arc<dyn PageStore>;
        self.roster.add(m);
        self.back_to_lease.soon();
        Ok(store)
    }
}
