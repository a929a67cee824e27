//! The region's ear to the daemon: when a donor reclaims a lease, move that
//! lease's pages elsewhere before the deadline — to a new lease if the
//! cluster has one, else home (the SSD tier if configured, else local RAM)
//! — then release it. The program keeps running throughout; `Relocatable`
//! keeps every page readable and every write kept while pages move.

use crate::grow::Grow;
use crate::homecoming::Homecoming;
use crate::pool::Member;
use crate::Copies;
use anyhow::Result;
use memlend_pool::api::{Ask, Client, Tell};
use memlend_remote::ClientConfig;
use memlend_store::layer::relocate::{self, Progress, RelocateOptions};
use memlend_store::layer::Lost;
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Activity reports to the daemon (reclaim takes the least active first).
const ACTIVITY_EVERY: Duration = Duration::from_secs(1);
/// Events set aside while a lease is awaited.
pub(crate) const MAX_PENDING: usize = 1024;
/// Events not yet taken by the lease thread (the daemon's lines wait in
/// the socket beyond this; a segment's ask waits to be queued).
const MAX_QUEUED: usize = 256;

/// What the lease thread acts on.
pub enum Event {
    Tell(Tell),
    Grow(Grow),
    /// The daemon's connection ended, and why.
    Gone(String),
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
    /// Each segment's store once leased (see `grow.rs`).
    pub(crate) segments: Vec<Option<Arc<dyn PageStore>>>,
    /// Where the mirrors of leases added later are counted.
    pub(crate) copies: Copies,
    /// When pages at home next ask for a lease.
    pub(crate) homecoming: Homecoming,
}

/// How `pool::open` hands the region to its lease thread.
pub struct Handoff {
    pub client: Client,
    pub members: Vec<Member>,
    pub cfg: ClientConfig,
    pub encrypt: bool,
    pub home: Option<PathBuf>,
    pub backed: bool,
    pub segments: usize,
    pub copies: Copies,
}

/// The channel that segments ask on; give its receiver to [`spawn`].
pub fn channel() -> (SyncSender<Event>, Receiver<Event>) {
    mpsc::sync_channel(MAX_QUEUED)
}

/// Start the lease thread; `first` is segment 0's store.
pub fn spawn(
    h: Handoff,
    tx: SyncSender<Event>,
    events: Receiver<Event>,
    first: Arc<dyn PageStore>,
) -> Result<()> {
    let reader = h.client.try_clone()?;
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
        segments,
        copies: h.copies,
        homecoming: Homecoming::new(),
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

    fn reclaim(&mut self, donor: u64, lease: u64, deadline_ms: u64) {
        let Some(i) = self.members.iter().position(|m| m.lease == Some((donor, lease))) else {
            let _ = self.client.ask(&Ask::Release { donor, lease });
            return;
        };
        let start = Instant::now();
        let deadline = start + Duration::from_millis(deadline_ms);
        let pages = self.members[i].pages;
        let from = self.members[i].donor_name.clone();
        tracing::info!(%from, lease, pages, deadline_ms, "reclaimed: moving the lease's pages");
        let wait = Duration::from_millis(deadline_ms / 4).min(Duration::from_secs(5));
        let (target, to, new_lease) = match self.replacement(pages, wait) {
            Some((store, g)) => (store, g.donor_name.clone(), Some((g.donor, g.lease))),
            None => match home_store(self.home.as_deref(), pages) {
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
            RelocateOptions { deadline: Some(deadline), batch_pages: relocate::MAX_BATCH_PAGES };
        let progress = |p: Progress| {
            if p.pages_copied.is_multiple_of(16_384) || p.pages_copied == p.pages_total {
                tracing::info!(copied = p.pages_copied, total = p.pages_total, "moving pages");
            }
        };
        match self.members[i].reloc.relocate(target, opts, &progress) {
            Ok(_) => {
                let _ = self.client.ask(&Ask::Release { donor, lease });
                let m = &mut self.members[i];
                m.lease = new_lease;
                m.donor_name = to.clone();
                if new_lease.is_none() {
                    self.homecoming.soon();
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
                    let _ = self.client.ask(&Ask::Release { donor: d, lease: l });
                }
            }
        }
    }

    /// A lease with no other copy is gone: its pages now fail at once when
    /// read (SIGBUS at the page, not a retry against a slab that no longer
    /// exists), and new writes go home, so eviction keeps working.
    fn lost(&mut self, donor: u64, lease: u64, why: &str) {
        tracing::error!(donor, lease, %why, "a lease was lost: its pages can no longer be read");
        let Some(m) = self.members.iter_mut().find(|m| m.lease == Some((donor, lease))) else {
            return;
        };
        let why = format!("lease {lease} from {} was lost ({why})", m.donor_name);
        let home = match home_store(self.home.as_deref(), m.pages) {
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

/// Where pages go when no donor takes them: the SSD directory, else RAM.
pub(crate) fn home_store(dir: Option<&Path>, pages: u64) -> Result<(Arc<dyn PageStore>, String)> {
    if let Some(dir) = dir {
        let o = crate::ssd::open(dir, Some(pages))?;
        return Ok((o.store, format!("home ({})", o.describe)));
    }
    let s: Arc<dyn PageStore> = Arc::new(RamStore::new(pages, RamOptions::default())?);
    Ok((s, "home (RAM)".into()))
}

#[cfg(test)]
#[path = "reclaim_tests.rs"]
mod tests;
