//! The region's ear to the daemon: when a donor reclaims a lease, move that
//! lease's pages elsewhere before the deadline — to a new lease if the
//! cluster has one, else home (the SSD tier if configured, else local RAM)
//! — then release it. The program keeps running throughout; `Relocatable`
//! keeps every page readable and every write kept while pages move.

use crate::pool::{open_lease, Member};
use anyhow::Result;
use memlend_pool::api::{Ask, Client, LeaseGrant, Tell};
use memlend_remote::ClientConfig;
use memlend_store::layer::relocate::{self, Progress, RelocateOptions};
use memlend_store::layer::Lost;
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Activity reports to the daemon (reclaim takes the least active first).
const ACTIVITY_EVERY: Duration = Duration::from_secs(1);
/// Lines queued while a replacement lease is awaited.
const MAX_PENDING: usize = 1024;

struct Ear {
    client: Client,
    members: Vec<Member>,
    cfg: ClientConfig,
    /// New leases are encrypted, as the first ones were.
    encrypt: bool,
    home: Option<PathBuf>,
    pending: VecDeque<Tell>,
    last_pages: Vec<u64>,
    /// Every lease has a copy on the local SSD (`--redundancy ssd`).
    backed: bool,
}

pub fn spawn(
    client: Client,
    members: Vec<Member>,
    (cfg, encrypt): (ClientConfig, bool),
    home: Option<PathBuf>,
    backed: bool,
) -> Result<()> {
    let last_pages = vec![0; members.len()];
    let pending = VecDeque::new();
    let ear = Ear { client, members, cfg, encrypt, home, pending, last_pages, backed };
    // The name keeps the preload shim out of this thread's allocations.
    std::thread::Builder::new().name("memlend-pool".into()).spawn(move || ear.run())?;
    Ok(())
}

impl Ear {
    fn run(mut self) {
        let mut next_report = Instant::now() + ACTIVITY_EVERY;
        loop {
            let tell = match self.pending.pop_front() {
                Some(t) => Some(t),
                None => match self.client.next(Some(
                    next_report
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(10)),
                )) {
                    Ok(Some(t)) => Some(t),
                    Ok(None) => {
                        tracing::error!("memlendd closed the connection: leases can no longer be moved on reclaim");
                        return;
                    }
                    Err(e) if is_timeout(&e) => None,
                    Err(e) => {
                        tracing::error!(error = %e, "lost memlendd");
                        return;
                    }
                },
            };
            match tell {
                Some(Tell::Reclaim { donor, lease, deadline_ms }) => {
                    self.reclaim(donor, lease, deadline_ms)
                }
                Some(Tell::Lost { donor, lease, why }) if self.backed => {
                    tracing::warn!(donor, lease, %why, "a lease was lost: its pages are read from their SSD copy");
                }
                Some(Tell::Lost { donor, lease, why }) => self.lost(donor, lease, &why),
                _ => {}
            }
            if Instant::now() >= next_report {
                next_report = Instant::now() + ACTIVITY_EVERY;
                self.report_activity();
            }
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
                eprintln!("memlend: {why}: reading one of its {} pages now raises SIGBUS", m.pages);
            }
            Err(e) => tracing::error!(error = %e, "cannot stand in for a lost lease"),
        }
    }

    /// A new lease of `pages` from the cluster, if one comes within `wait`.
    fn replacement(
        &mut self,
        pages: u64,
        wait: Duration,
    ) -> Option<(Arc<dyn PageStore>, LeaseGrant)> {
        self.client.ask(&Ask::Want { bytes: pages * PAGE_SIZE as u64 }).ok()?;
        let until = Instant::now() + wait;
        let mut got: Vec<LeaseGrant> = Vec::new();
        let mut bytes = 0;
        while bytes < pages * PAGE_SIZE as u64 {
            let left = until.checked_duration_since(Instant::now())?;
            match self.client.next(Some(left.max(Duration::from_millis(1)))) {
                Ok(Some(Tell::Lease(g))) => {
                    bytes += g.bytes;
                    got.push(g);
                }
                Ok(Some(Tell::Unmet { .. })) => break,
                Ok(Some(other)) if self.pending.len() < MAX_PENDING => {
                    self.pending.push_back(other)
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        // One lease that covers the member, or nothing: a member is one store.
        let fits = got.iter().position(|g| g.bytes >= pages * PAGE_SIZE as u64);
        for (j, g) in got.iter().enumerate() {
            if Some(j) != fits {
                let _ = self.client.ask(&Ask::Release { donor: g.donor, lease: g.lease });
            }
        }
        let g = got.swap_remove(fits?);
        match open_lease(&g, &self.cfg, self.encrypt) {
            Ok(s) => Some((s, g)),
            Err(e) => {
                tracing::warn!(error = %e, "a replacement lease could not be opened");
                let _ = self.client.ask(&Ask::Release { donor: g.donor, lease: g.lease });
                None
            }
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
fn home_store(dir: Option<&Path>, pages: u64) -> Result<(Arc<dyn PageStore>, String)> {
    if let Some(dir) = dir {
        let o = crate::ssd::open(dir, Some(pages))?;
        return Ok((o.store, format!("home ({})", o.describe)));
    }
    let s: Arc<dyn PageStore> = Arc::new(RamStore::new(pages, RamOptions::default())?);
    Ok((s, "home (RAM)".into()))
}

/// Nothing came, and the daemon is still there. A read with a timeout is
/// not restarted after the process was stopped and continued: EINTR.
fn is_timeout(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    matches!(e.kind(), WouldBlock | TimedOut | Interrupted)
}
