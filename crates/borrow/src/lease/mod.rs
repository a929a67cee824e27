//! The lease agent: when a region borrows from the cluster (`--pool`), one
//! thread per region, its ear to the local `memlendd`, follows the region's
//! leases for as long as it lives. `open::cluster` opens the region and
//! hands it over ([`Handoff`], [`spawn`]); from then on the agent
//!
//! - leases each later segment when it is first written to (`grow.rs`),
//!   asking the daemon for grants and opening them (`grants.rs`);
//! - moves a reclaimed lease's pages to another lease or home before the
//!   deadline, and stands in for a lost one (`reclaim.rs`);
//! - brings pages that went home back to a lease when the cluster has room
//!   again (`back_to_lease.rs`);
//! - reports each lease's activity and what waits at home to the daemon.

mod back_to_lease;
mod grants;
pub mod grow;
pub mod mirrored;
mod reclaim;

pub(crate) use grants::{backed_by_ssd, open_lease};

use crate::Copies;
use anyhow::Result;
use back_to_lease::BackToLease;
use memlend_pool::api::{Ask, Client, Tell};
use memlend_remote::ClientConfig;
use memlend_store::layer::relocate::Relocatable;
use memlend_store::layer::Stats;
use memlend_store::PageStore;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Activity reports to the daemon (reclaim takes the least active first).
const ACTIVITY_EVERY: Duration = Duration::from_secs(1);
/// Events set aside while a lease is awaited.
pub(crate) const PENDING_MAX: usize = 1024;
/// Events not yet taken by the lease thread (the daemon's lines wait in
/// the socket beyond this; a segment's ask waits to be queued).
const QUEUED_MAX: usize = 256;

/// What the lease thread acts on.
pub enum Event {
    Tell(Tell),
    Grow(Grow),
    /// A mirror's rebuilder asks for a new leg (`mirrored.rs`).
    Spare(mirrored::Spare),
    /// The daemon's connection ended, and why.
    Gone(String),
}

/// A segment's request for its lease, answered by the region's lease
/// thread with the store to write to, or why there is none.
pub struct Grow {
    pub segment: usize,
    pub pages: u64,
    pub reply: SyncSender<Result<Arc<dyn PageStore>, String>>,
}

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

pub(crate) struct Ear {
    pub(crate) client: Client,
    pub(crate) events: Receiver<Event>,
    pub(crate) members: Vec<Member>,
    pub(crate) cfg: ClientConfig,
    /// New leases are encrypted, as the first ones were.
    pub(crate) encrypt: bool,
    pub(crate) home: Option<PathBuf>,
    pub(crate) pending: VecDeque<Event>,
    pub(crate) last_pages: Vec<u64>,
    /// Every lease has a copy on the local SSD (`--redundancy ssd`).
    pub(crate) backed: bool,
    /// Every segment is a mirror over two legs of leases (`mirrored.rs`).
    pub(crate) mirrored: bool,
    /// Where a mirror's rebuilder asks for a spare leg.
    pub(crate) asks: SyncSender<Event>,
    /// Each segment's store once leased (see `grow.rs`).
    pub(crate) segments: Vec<Option<Arc<dyn PageStore>>>,
    /// Where the mirrors of leases added later are counted.
    pub(crate) copies: Copies,
    /// When pages at home next ask for a lease.
    pub(crate) back_to_lease: BackToLease,
}

/// How `open::cluster::open` hands the region to its lease thread.
pub struct Handoff {
    pub client: Client,
    pub members: Vec<Member>,
    pub cfg: ClientConfig,
    pub encrypt: bool,
    pub home: Option<PathBuf>,
    pub backed: bool,
    pub mirrored: bool,
    pub segments: usize,
    pub copies: Copies,
}

/// The channel that segments ask on; give its receiver to [`spawn`].
pub fn channel() -> (SyncSender<Event>, Receiver<Event>) {
    mpsc::sync_channel(QUEUED_MAX)
}

/// Start the lease thread; `first` is segment 0's store.
pub fn spawn(
    h: Handoff,
    tx: SyncSender<Event>,
    events: Receiver<Event>,
    first: Arc<dyn PageStore>,
) -> Result<()> {
    let reader = h.client.try_clone()?;
    let asks = tx.clone();
    // The names keep the preload shim out of these threads' allocations.
    std::thread::Builder::new().name("memlend-poolrd".into()).spawn(move || read(reader, tx))?;
    let mut segments = vec![None; h.segments];
    segments[0] = Some(first);
    let ear = Ear {
        client: h.client,
        events,
        last_pages: vec![0; h.members.len()],
        members: h.members,
        cfg: h.cfg,
        encrypt: h.encrypt,
        home: h.home,
        pending: VecDeque::new(),
        backed: h.backed,
        mirrored: h.mirrored,
        asks,
        segments,
        copies: h.copies,
        back_to_lease: BackToLease::new(),
    };
    std::thread::Builder::new().name("memlend-pool".into()).spawn(move || ear.run())?;
    Ok(())
}

/// Pass the daemon's lines on to the lease thread, until either ends.
fn read(mut client: Client, tx: SyncSender<Event>) {
    loop {
        let event = match client.next(None) {
            Ok(Some(t)) => Event::Tell(t),
            Ok(None) => Event::Gone("memlendd closed the connection".into()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Event::Gone(format!("lost memlendd: {e}")),
        };
        let last = matches!(event, Event::Gone(_));
        if tx.send(event).is_err() || last {
            return;
        }
    }
}

impl Ear {
    fn run(mut self) {
        let mut next_report = Instant::now() + ACTIVITY_EVERY;
        loop {
            let event = match self.pending.pop_front() {
                Some(e) => Some(e),
                None => {
                    let wait = next_report.saturating_duration_since(Instant::now());
                    match self.events.recv_timeout(wait.max(Duration::from_millis(10))) {
                        Ok(e) => Some(e),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            };
            match event {
                Some(Event::Tell(t)) => self.tell(t),
                Some(Event::Grow(g)) => self.grow(g),
                Some(Event::Spare(s)) => self.spare(s),
                Some(Event::Gone(why)) => {
                    tracing::error!(%why, "leases can no longer be moved on reclaim or added");
                    return;
                }
                None => {}
            }
            if Instant::now() >= next_report {
                next_report = Instant::now() + ACTIVITY_EVERY;
                self.report_activity();
            }
            self.report_home();
            self.bring_back();
        }
    }

    fn tell(&mut self, tell: Tell) {
        match tell {
            Tell::Reclaim { donor, lease, deadline_ms } => self.reclaim(donor, lease, deadline_ms),
            Tell::Lost { donor, lease, why } if self.backed => {
                tracing::warn!(donor, lease, %why, "a lease was lost: its pages are read from their SSD copy");
            }
            Tell::Lost { donor, lease, why } if self.mirrored => self.lost_leg(donor, lease, &why),
            Tell::Lost { donor, lease, why } => self.lost(donor, lease, &why),
            // A grant that came after its ask stopped waiting (the daemon
            // retries for a few seconds): nobody will use it, so give it
            // back rather than hold the donor's memory until the exit.
            Tell::Lease(g) => {
                tracing::info!(lease = g.lease, from = %g.donor_name, "a late grant, given back");
                let _ = self.client.ask(&Ask::Release { donor: g.donor, lease: g.lease });
            }
            _ => {}
        }
    }

    fn report_activity(&mut self) {
        for (i, m) in self.members.iter().enumerate() {
            let snap = m.stats.snapshot();
            let pages = snap.read.pages + snap.write.pages;
            let rate = pages.saturating_sub(self.last_pages[i]) / ACTIVITY_EVERY.as_secs().max(1);
            self.last_pages[i] = pages;
            if let Some((donor, lease)) = m.lease {
                let _ = self.client.ask(&Ask::Activity {
                    donor,
                    lease,
                    pages_per_s: rate.min(u32::MAX as u64) as u32,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
