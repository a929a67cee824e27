//! How the lease thread gets new leases while the program runs: one to
//! take a reclaimed lease's pages or bring pages home back to a lease, or
//! the leases for a segment that is written to for the first time
//! (`grow.rs`); and how a granted lease's slab is opened (also for the
//! first segment, by `open::cluster`).

use super::reclaim::home_store;
use super::{member, Ear, Event, Grow, Member, PENDING_MAX};
use anyhow::{Context, Result};
use memlend_pool::api::{self, Ask, LeaseGrant, Tell};
use memlend_remote::ClientConfig;
use memlend_store::layer::{Concat, Mirror, MirrorOptions};
use memlend_store::{PageStore, PAGE_SIZE};
use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first pause before asking again for what the cluster could not lend.
const RETRY_FIRST: Duration = Duration::from_millis(100);

impl Ear {
    /// Leases toward `bytes` that come within `wait`, from donors other
    /// than `avoid`. On an `Unmet`, ask again for what is missing after a
    /// pause (doubling) when `again`, else stop. Other events are set aside
    /// for later.
    pub(crate) fn await_grants(
        &mut self,
        bytes: u64,
        wait: Duration,
        again: bool,
        avoid: &[u64],
    ) -> Vec<LeaseGrant> {
        let mut got = Vec::new();
        let want = |bytes| Ask::Want { bytes, avoid: avoid.to_vec() };
        if self.client.ask(&want(bytes)).is_err() {
            return got;
        }
        let until = Instant::now() + wait;
        let (mut sum, mut pause) = (0, RETRY_FIRST);
        while sum < bytes {
            let Some(left) = until.checked_duration_since(Instant::now()) else { break };
            match self.events.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(Event::Tell(Tell::Lease(g))) => {
                    sum += g.bytes;
                    got.push(g);
                }
                Ok(Event::Tell(Tell::Unmet { bytes: unmet })) => {
                    if !again || Instant::now() + pause >= until {
                        break;
                    }
                    std::thread::sleep(pause);
                    pause *= 2;
                    if self.client.ask(&want(unmet)).is_err() {
                        break;
                    }
                }
                Ok(Event::Tell(Tell::Error { message })) => {
                    tracing::warn!(%message, "memlendd refused an ask for leases");
                    break;
                }
                Ok(other) if self.pending.len() < PENDING_MAX => self.pending.push_back(other),
                Ok(_) => tracing::error!("too many events set aside; one dropped"),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        got
    }

    pub(crate) fn release(&mut self, grants: &[LeaseGrant]) {
        for g in grants {
            let _ = self.client.ask(&Ask::Release { donor: g.donor, lease: g.lease });
        }
    }

    /// A new lease from the cluster for member `i`'s pages, if one comes
    /// within `wait`: away from the donors of its segment when the segment
    /// is mirrored.
    pub(crate) fn replacement(
        &mut self,
        i: usize,
        wait: Duration,
    ) -> Option<(Arc<dyn PageStore>, LeaseGrant)> {
        let pages = self.members[i].pages;
        let avoid = self.avoid_for(self.members[i].segment);
        let mut got = self.await_grants(pages * PAGE_SIZE as u64, wait, false, &avoid);
        // One lease that covers the member, or nothing: a member is one store.
        let fits = got.iter().position(|g| g.bytes >= pages * PAGE_SIZE as u64);
        let g = fits.map(|j| got.swap_remove(j));
        self.release(&got);
        let g = g?;
        match open_lease(&g, &self.cfg, self.encrypt) {
            Ok(s) => Some((s, g)),
            Err(e) => {
                tracing::warn!(error = %e, "a replacement lease could not be opened");
                self.release(std::slice::from_ref(&g));
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
        if self.mirrored {
            return self.lease_mirrored(segment, pages);
        }
        let bytes = pages * PAGE_SIZE as u64;
        let grants = self.await_grants(bytes, super::grow::GROW_WAIT, true, &[]);
        let got: u64 = grants.iter().map(|g| g.bytes).sum();
        if got < bytes {
            self.release(&grants);
            let lent = crate::human_pages(got / PAGE_SIZE as u64);
            let why = format!("the cluster lent {lent} of {}", crate::human_pages(pages));
            return self.segment_home(segment, pages, why);
        }
        let mut members = Vec::new();
        for g in &grants {
            match self.open_member(g, segment) {
                Ok(m) => members.push(m),
                Err(e) => {
                    self.release(&grants);
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
            self.members.push(m);
            self.last_pages.push(0);
        }
        Ok(store)
    }

    /// A member for grant `g`, and the store the segment writes to: the
    /// lease, or a mirror of it and an SSD file when every lease has one.
    pub(crate) fn open_member(
        &mut self,
        g: &LeaseGrant,
        segment: usize,
    ) -> anyhow::Result<(Member, Arc<dyn PageStore>)> {
        let store = open_lease(g, &self.cfg, self.encrypt)?;
        let m = member(Some((g.donor, g.lease)), &g.donor_name, store, segment);
        let lease = Arc::clone(&m.stats) as Arc<dyn PageStore>;
        if !self.backed {
            return Ok((m, lease));
        }
        let dir = self.home.clone().unwrap_or_else(crate::default_ssd_dir);
        let mirror = Arc::new(backed_by_ssd(&dir, lease, &g.donor_name, m.pages)?);
        self.copies.later.lock().push(Arc::clone(&mirror));
        Ok((m, mirror))
    }

    /// No lease for a segment: with an SSD directory it lives there (never
    /// reclaimed); without one the writer keeps its pages and asks again.
    fn segment_home(
        &mut self,
        segment: usize,
        pages: u64,
        why: String,
    ) -> Result<Arc<dyn PageStore>, String> {
        let Some(dir) = self.home.clone() else {
            tracing::warn!(segment, %why, "no lease for a segment yet; its pages stay resident");
            return Err(why);
        };
        let (store, name) = home_store(Some(&dir), pages).map_err(|e| format!("{why}; {e:#}"))?;
        tracing::warn!(segment, %why, to = %name, "a segment goes home: no lease");
        let mut m = member(None, &name, store, segment);
        // Under `--redundancy ssd` no SSD copy sits above it: a lease would
        // be its only home, so it stays on the SSD.
        m.may_return = !self.backed;
        let store = Arc::clone(&m.stats) as Arc<dyn PageStore>;
        self.members.push(m);
        self.back_to_lease.soon();
        self.last_pages.push(0);
        Ok(store)
    }
}

/// Open lease `g`'s slab, encrypted (tags on the donor) when `encrypt`.
pub fn open_lease(g: &LeaseGrant, cfg: &ClientConfig, encrypt: bool) -> Result<Arc<dyn PageStore>> {
    let mut cfg = cfg.clone();
    cfg.borrower_id = api::credential_from_hex(&g.credential).map_err(anyhow::Error::msg)?;
    let pages = g.bytes / PAGE_SIZE as u64;
    let s = crate::open::seal::open(g.data_addr, &cfg, pages, encrypt).with_context(|| {
        format!("cannot open lease {} on {} ({})", g.lease, g.donor_name, g.data_addr)
    })?;
    crate::open::seal::wrap(s, encrypt)
}

/// A lease with a write-through copy on the local SSD, read only when the
/// lease fails: its donor crashed, or it reclaimed the lease and revoked it
/// before the pages could move (a borrower too slow for the deadline).
pub(crate) fn backed_by_ssd(
    dir: &Path,
    lease: Arc<dyn PageStore>,
    donor: &str,
    pages: u64,
) -> Result<Mirror> {
    let file = crate::open::ssd::open(dir, Some(pages))?.store;
    let legs = vec![(lease, donor.to_string()), (file, "ssd".to_string())];
    Ok(Mirror::new(legs, pages, MirrorOptions::default(), None)?)
}
