//! Opening a far store for a placement: one donor, a stripe over several
//! (`donors.rs`), a second home for every page (`redundant.rs`), leases
//! from the cluster cut into segments (`cluster.rs`, which hands the region
//! to its lease agent, `crate::lease`), or a file on local SSD (`ssd.rs`).
//! Slabs on donors are sealed here (`seal.rs`).

pub mod cluster;
mod donors;
pub mod redundant;

use crate::{Opened, Placement, Redundancy};
use anyhow::{bail, Context, Result};

impl Placement {
    /// Open a store of `pages` pages, or, when `None`, as many as the place
    /// has room for, up to [`DEFAULT_MAX_PAGES`](crate::DEFAULT_MAX_PAGES). Pages that go to donors
    /// are encrypted here (AES-256-GCM, a fresh key per slab that never
    /// leaves this process; `open/seal.rs`), so a donor holds only ciphertext,
    /// unless `no_encrypt`. The named layers (`layers`) go on top.
    /// A layer that keeps spare pages below (`pack`) asks the base for
    /// more pages than the store offers: `Stack::pages_below`.
    pub fn open(&self, pages: Option<u64>) -> Result<Opened> {
        let mut opened = self.open_plain(pages.map(|p| self.layers.pages_below(p)))?;
        if self.encrypts() {
            opened.describe.push_str(", encrypted");
        }
        if !self.layers.is_empty() {
            let built = self.layers.build(opened.store).context("building the named layers")?;
            opened.store = built.store;
            opened.pages = opened.store.info().pages;
            opened.reports = built.reports;
            opened.describe.push_str(&format!(", layers {}", self.layers));
        }
        Ok(opened)
    }

    /// Whether slabs on donors are encrypted.
    fn encrypts(&self) -> bool {
        let remote = !self.donors.is_empty() || self.pool.is_some();
        remote && !self.no_encrypt
    }

    fn open_plain(&self, pages: Option<u64>) -> Result<Opened> {
        if pages == Some(0) {
            bail!("a far-memory store needs at least one page");
        }
        if self.redundancy != Redundancy::None && self.pool.is_none() {
            if self.donors.is_empty() {
                bail!("--redundancy {} needs donors (--donor) or --pool", self.redundancy);
            }
            return redundant::open(self, pages);
        }
        if self.redundancy == Redundancy::Erasure && self.pool.is_some() {
            bail!("--pool takes --redundancy mirror or ssd; erasure over leases is not built yet");
        }
        if let Some(api) = &self.pool {
            if !self.donors.is_empty() {
                bail!("give --pool or donors, not both");
            }
            let Some(pages) = pages else { bail!("borrowing from the cluster needs a size") };
            return cluster::open(self, api, pages);
        }
        if !self.donors.is_empty() {
            if self.ssd.is_some() {
                bail!("give donors or an SSD path, not both");
            }
            return donors::open(self, pages);
        }
        let path = self.ssd.clone().unwrap_or_else(crate::default_ssd_dir);
        crate::ssd::open(&path, pages)
    }
}

/// Bytes free on every donor of `p` for a stripe (see [`Placement::open`]);
/// an error names a donor that cannot be reached or has no room.
pub fn room_on_donors(p: &Placement) -> Result<u64> {
    donors::room_bytes(p)
}
