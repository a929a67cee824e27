//! How the lease agent opens what it is granted: a lease's slab (sealed
//! as the region's first leases were), with its SSD copy under
//! `--redundancy ssd`; a mirrored segment's leg of leases; and the home store that takes pages no donor holds.

use super::roster::{member, Member};
use crate::Copies;
use anyhow::{Context, Result};
use memlend_pool::api::{self, LeaseGrant};
use memlend_remote::ClientConfig;
use memlend_store::layer::{Concat, Mirror, MirrorOptions};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What every lease of the region is opened with.
pub(crate) struct Slabs {
    pub(crate) cfg: ClientConfig,
    /// New leases are encrypted, as the first ones were.
    pub(crate) encrypt: bool,
    /// Every lease has a copy on the local SSD (`--redundancy ssd`).
    pub(crate) backed: bool,
    /// The SSD directory, if the region has one.
    pub(crate) home: Option<PathBuf>,
    /// Where the mirrors of leases added later are counted.
    pub(crate) copies: Copies,
}

impl Slabs {
    /// A member for grant `g`, and the store the segment writes to: the
    /// lease, or a mirror of it and an SSD file when every lease has one.
    pub(crate) fn open_member(
        &self,
        g: &LeaseGrant,
        segment: usize,
    ) -> Result<(Member, Arc<dyn PageStore>)> {
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

    /// One leg of a mirrored segment over `grants`.
    pub(crate) fn open_leg(&self, grants: &[LeaseGrant], segment: usize) -> Result<Leg> {
        open_leg(grants, segment, &self.cfg, self.encrypt)
    }

    /// A home store of `pages`, and its name.
    pub(crate) fn home_store(&self, pages: u64) -> Result<(Arc<dyn PageStore>, String)> {
        home_store(self.home.as_deref(), pages)
    }
}

/// Open lease `g`'s slab, encrypted (tags on the donor) when `encrypt`.
pub fn open_lease(g: &LeaseGrant, cfg: &ClientConfig, encrypt: bool) -> Result<Arc<dyn PageStore>> {
    let mut cfg = cfg.clone();
    cfg.borrower_id = api::credential_from_hex(&g.credential).map_err(anyhow::Error::msg)?;
    let pages = g.bytes / PAGE_SIZE as u64;
    let s = crate::seal::open(g.data_addr, &cfg, pages, encrypt).with_context(|| {
        format!("cannot open lease {} on {} ({})", g.lease, g.donor_name, g.data_addr)
    })?;
    crate::seal::wrap(s, encrypt)
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
    let file = crate::ssd::open(dir, Some(pages))?.store;
    let legs = vec![(lease, donor.to_string()), (file, "ssd".to_string())];
    Ok(Mirror::new(legs, pages, MirrorOptions::default(), None)?)
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

/// One leg: its leases as members, and the store over them.
pub struct Leg {
    pub members: Vec<Member>,
    pub store: Arc<dyn PageStore>,
    pub label: String,
}

/// Open `grants` as one leg of `segment`.
pub fn open_leg(
    grants: &[LeaseGrant],
    segment: usize,
    cfg: &ClientConfig,
    encrypt: bool,
) -> Result<Leg> {
    let mut members = Vec::with_capacity(grants.len());
    for g in grants {
        let store = open_lease(g, cfg, encrypt)?;
        members.push(member(Some((g.donor, g.lease)), &g.donor_name, store, segment));
    }
    let mut stores: Vec<Arc<dyn PageStore>> =
        members.iter().map(|m| Arc::clone(&m.stats) as Arc<dyn PageStore>).collect();
    let store: Arc<dyn PageStore> = match stores.len() {
        1 => stores.pop().expect("one store"),
        _ => Arc::new(Concat::new(stores).context("joining a leg's leases")?),
    };
    Ok(Leg { members, store, label: leg_label(grants) })
}

/// "n1" or "n1+n3", with the donors' domains where they name one.
pub fn leg_label(grants: &[LeaseGrant]) -> String {
    let name = |g: &LeaseGrant| match g.donor_domain.as_str() {
        "" => g.donor_name.clone(),
        d => format!("{} ({d})", g.donor_name),
    };
    grants.iter().map(name).collect::<Vec<_>>().join("+")
}
