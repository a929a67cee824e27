//! Mirrored regions (`--pool --redundancy mirror`). Each segment is a
//! `Mirror` of two legs; a leg is leases joined end to end. The second
//! leg's ask names the first leg's donors to avoid (`Ask::Want`), which the
//! engine reads as "another node, in another failure domain when one has
//! room". Each lease is a member like any other: a reclaim moves its pages
//! while the mirror keeps writing both legs, to a lease that again avoids
//! the segment's donors. A donor that dies fails its leg; the mirror reads
//! the other, and its rebuilder asks the lease thread for a spare leg
//! (`Event::Spare`), leased away from the segment's donors, and fills it.

use super::grow::{Asks, GROW_WAIT};
use super::roster::{donors, Member};
use super::slabs::Leg;
use super::{Agent, Event};
use anyhow::Result;
use memlend_pool::api::LeaseGrant;
use memlend_pool::engine::AVOID_NODES_MAX;
use memlend_store::layer::mirror::SpareFn;
use memlend_store::layer::{Mirror, MirrorOptions};
use memlend_store::{PageStore, StoreError, StoreResult, PAGE_SIZE};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// What a spare ask is answered with: the leg's store and label, or why not.
pub type SpareAnswer = Result<(Arc<dyn PageStore>, String), String>;

/// A mirror's rebuilder asking for a new leg for `segment`.
pub struct Spare {
    pub segment: usize,
    pub pages: u64,
    pub reply: SyncSender<SpareAnswer>,
}

/// The donors of `grants`, for the other leg to avoid.
pub fn donors_of(grants: &[LeaseGrant]) -> Vec<u64> {
    let mut v: Vec<u64> = grants.iter().map(|g| g.donor).collect();
    v.sort_unstable();
    v.dedup();
    v.truncate(AVOID_NODES_MAX);
    v
}

/// The mirror over legs `a` and `b` of `segment`, reading from both (the
/// donors are alike), with spares asked of the lease thread on `asks`.
pub fn mirror(a: &Leg, b: &Leg, pages: u64, segment: usize, asks: Asks) -> Result<Mirror> {
    let spare: SpareFn = Box::new(move |req| ask_spare(segment, req.pages, &asks));
    let opts = MirrorOptions { spread_reads: true, ..MirrorOptions::default() };
    let legs =
        vec![(Arc::clone(&a.store), a.label.clone()), (Arc::clone(&b.store), b.label.clone())];
    Ok(Mirror::new(legs, pages, opts, Some(spare))?)
}

fn ask_spare(segment: usize, pages: u64, asks: &Asks) -> StoreResult<(Arc<dyn PageStore>, String)> {
    let (reply, answer) = mpsc::sync_channel(1);
    let gone = || StoreError::Unavailable("the region's lease thread has stopped".into());
    asks.send(Event::Spare(Spare { segment, pages, reply })).map_err(|_| gone())?;
    // Two waits for the cluster (both legs' worth of asking) and a margin.
    match answer.recv_timeout(2 * GROW_WAIT + Duration::from_secs(2)) {
        Ok(r) => r.map_err(StoreError::Unavailable),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Err(StoreError::Unavailable("no spare lease in time".into()))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
    }
}

impl Agent {
    /// The donors of `segment`'s leases, which a new lease for it avoids
    /// when the region is mirrored (the reclaimed or failed one included).
    pub(crate) fn avoid_for(&self, segment: usize) -> Vec<u64> {
        match self.mirror_asks {
            Some(_) => self.roster.donors_of_segment(segment),
            None => Vec::new(),
        }
    }

    /// Both legs of a mirrored segment, or why not (the writer keeps its
    /// pages and asks again): a mirror never settles for one copy. The
    /// mirror's rebuilder asks for spares on `asks`.
    pub(crate) fn lease_mirrored(
        &mut self,
        segment: usize,
        pages: u64,
        asks: Asks,
    ) -> Result<Arc<dyn PageStore>, String> {
        let a = self.lease_leg(segment, pages, &[])?;
        let avoid = donors(a.members.iter());
        let b = match self.lease_leg(segment, pages, &avoid) {
            Ok(b) => b,
            Err(e) => {
                self.release_members(&a.members);
                return Err(format!("no donor apart from {} for the second copy: {e}", a.label));
            }
        };
        let m = match mirror(&a, &b, pages, segment, asks) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                self.release_members(&a.members);
                self.release_members(&b.members);
                return Err(format!("{e:#}"));
            }
        };
        tracing::info!(segment, pages, a = %a.label, b = %b.label, "leased a mirrored segment");
        for m in a.members.into_iter().chain(b.members) {
            self.roster.add(m);
        }
        self.slabs.copies.later.lock().push(Arc::clone(&m));
        Ok(m)
    }

    /// A new leg for a mirror whose leg failed, away from the segment's donors.
    pub(crate) fn spare(&mut self, s: Spare) {
        let avoid = self.avoid_for(s.segment);
        let answer = self.lease_leg(s.segment, s.pages, &avoid).map(|leg| {
            tracing::info!(segment = s.segment, to = %leg.label, "a spare leg for a mirror");
            let out = (Arc::clone(&leg.store), leg.label.clone());
            for m in leg.members {
                self.roster.add(m);
            }
            out
        });
        let _ = s.reply.send(answer);
    }

    /// A lease of a mirror's leg is gone: the mirror already reads the other
    /// leg (the lost one's I/O fails) and rebuilds; the member is dead.
    pub(crate) fn lost_leg(&mut self, donor: u64, lease: u64, why: &str) {
        tracing::warn!(donor, lease, %why, "a mirrored lease was lost: its pages are read from the other copy");
        if let Some(i) = self.roster.find(donor, lease) {
            let m = &mut self.roster.members[i];
            m.lease = None;
            m.may_return = false;
        }
    }

    fn lease_leg(&mut self, segment: usize, pages: u64, avoid: &[u64]) -> Result<Leg, String> {
        let bytes = pages * PAGE_SIZE as u64;
        let grants = self.daemon.await_grants(bytes, GROW_WAIT, true, avoid);
        let got: u64 = grants.iter().map(|g| g.bytes).sum();
        if got < bytes {
            self.daemon.release_grants(&grants);
            let lent = crate::human_pages(got / PAGE_SIZE as u64);
            return Err(format!("the cluster lent {lent} of {}", crate::human_pages(pages)));
        }
        self.slabs.open_leg(&grants, segment).map_err(|e| {
            self.daemon.release_grants(&grants);
            format!("{e:#}")
        })
    }

    fn release_members(&mut self, members: &[Member]) {
        for (donor, lease) in members.iter().filter_map(|m| m.lease) {
            self.daemon.release(donor, lease);
        }
    }
}
