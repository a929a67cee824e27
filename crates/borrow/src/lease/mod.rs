//! The lease agent: when a region borrows from the cluster (`--pool`), one
//! thread per region follows the region's leases for as long as it lives.
//! `open::cluster` opens the region and hands it over ([`Handoff`],
//! [`spawn`]). The agent (`Agent`) joins parts that own their state:
//!
//! - `daemon.rs`: the line to the local `memlendd` (asks out, tells in,
//!   events set aside while grants are awaited);
//! - `roster.rs`: the members (each lease or home store) and their
//!   activity reports;
//! - `slabs.rs`: how a grant's slab, its SSD copy or a home store is opened;
//! - `back_to_lease.rs`: the backoff of pages at home asking for a lease.
//!
//! What the agent does with them is written on `Agent`, one concern a
//! file: a segment's first write or its lease ahead, and a replacement
//! lease (`grants.rs`; the segments' side is `grow.rs`); a reclaim or a
//! lost lease (`reclaim.rs`); mirrored segments and their spare legs
//! (`mirrored.rs`); pages at home going back to a lease
//! (`back_to_lease.rs`).

mod back_to_lease;
mod daemon;
mod grants;
pub mod grow;
pub mod mirrored;
mod reclaim;
mod roster;
pub mod slabs;

pub use roster::{member, Member};
pub(crate) use slabs::{backed_by_ssd, open_lease};

use crate::Copies;
use anyhow::Result;
use back_to_lease::BackToLease;
use daemon::Daemon;
use grow::Asks;
use memlend_pool::api::{Client, Tell};
use memlend_remote::ClientConfig;
use memlend_store::PageStore;
use roster::Roster;
use slabs::Slabs;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};
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

/// The lease agent: the parts it joins, each with its own state.
pub(crate) struct Agent {
    daemon: Daemon,
    roster: Roster,
    slabs: Slabs,
    /// Each segment's store once leased (`grow.rs`).
    segments: Vec<Option<Arc<dyn PageStore>>>,
    /// Set when every segment is a mirror over two legs of leases
    /// (`mirrored.rs`): where the mirrors' rebuilders ask for spare legs.
    mirror_asks: Option<Asks>,
    /// When pages at home next ask for a lease.
    back_to_lease: BackToLease,
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
    let mirror_asks = h.mirrored.then(|| tx.clone());
    // The names keep the preload shim out of these threads' allocations.
    std::thread::Builder::new().name("memlend-poolrd".into()).spawn(move || read(reader, tx))?;
    let mut segments = vec![None; h.segments];
    segments[0] = Some(first);
    let slabs =
        Slabs { cfg: h.cfg, encrypt: h.encrypt, backed: h.backed, home: h.home, copies: h.copies };
    let agent = Agent {
        daemon: Daemon::new(h.client, events),
        roster: Roster::new(h.members),
        slabs,
        segments,
        mirror_asks,
        back_to_lease: BackToLease::new(),
    };
    std::thread::Builder::new().name("memlend-pool".into()).spawn(move || agent.run())?;
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

impl Agent {
    fn run(mut self) {
        let mut next_report = Instant::now() + ACTIVITY_EVERY;
        loop {
            let wait = next_report.saturating_duration_since(Instant::now());
            match self.daemon.next(wait.max(Duration::from_millis(10))) {
                Ok(Some(Event::Tell(t))) => self.tell(t),
                Ok(Some(Event::Grow(g))) => self.grow(g),
                Ok(Some(Event::Spare(s))) => self.spare(s),
                Ok(Some(Event::Gone(why))) => {
                    tracing::error!(%why, "leases can no longer be moved on reclaim or added");
                    return;
                }
                Ok(None) => {}
                Err(()) => return,
            }
            if Instant::now() >= next_report {
                next_report = Instant::now() + ACTIVITY_EVERY;
                self.roster.report_activity(&mut self.daemon, ACTIVITY_EVERY);
            }
            self.report_home();
            self.bring_back();
        }
    }

    fn tell(&mut self, tell: Tell) {
        match tell {
            Tell::Reclaim { donor, lease, deadline_ms } => self.reclaim(donor, lease, deadline_ms),
            Tell::Lost { donor, lease, why } if self.slabs.backed => {
                tracing::warn!(donor, lease, %why, "a lease was lost: its pages are read from their SSD copy");
            }
            Tell::Lost { donor, lease, why } if self.mirror_asks.is_some() => {
                self.lost_leg(donor, lease, &why)
            }
            Tell::Lost { donor, lease, why } => self.lost(donor, lease, &why),
            // A grant that came after its ask stopped waiting (the daemon
            // retries for a few seconds): nobody will use it, so give it
            // back rather than hold the donor's memory until the exit.
            Tell::Lease(g) => {
                tracing::info!(lease = g.lease, from = %g.donor_name, "a late grant, given back");
                self.daemon.release(g.donor, g.lease);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
