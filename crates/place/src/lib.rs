//! Where a far-memory region keeps its pages, chosen when it is created:
//! one donor, a stripe over several donors, or a file on local SSD (NEC's
//! "SSD as memory", and the default when no donor is named).
//!
//! Every front door (`memlend far`, `memlend run`'s preload shim, the C ABI
//! and Python) opens its store here, so they size, name and clean up stores
//! the same way.

mod donors;
pub mod env;
pub mod grow;
mod homecoming;
mod leases;
pub mod pool;
mod reclaim;
pub mod redundant;
mod seal;
mod ssd;

pub use redundant::Redundancy;

use anyhow::{bail, Result};
use memlend_store::PageStore;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Chunk of a stripe over several donors: big enough that a sequential run
/// stays on one donor for a while, small enough to spread a hot set.
pub const STRIPE_CHUNK_PAGES: u64 = 64;

/// The largest store opened when no size is given (sparse, so only what is
/// written costs anything).
pub const DEFAULT_MAX_PAGES: u64 = (64 << 30) / memlend_store::PAGE_SIZE as u64;

/// Where the pages go, and the credentials to get there.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Donors' page-protocol addresses; pages are striped over all of them.
    pub donors: Vec<SocketAddr>,
    /// A local file for the pages: a new path, a directory (a fresh file is
    /// made inside it), or a block device. Used when `donors` is empty;
    /// `None` then means [`default_ssd_dir`].
    pub ssd: Option<PathBuf>,
    /// The cluster key file, for donors.
    pub key: Option<PathBuf>,
    /// Talk to donors that run without a key.
    pub insecure: bool,
    /// Borrow from the cluster through the local memlendd's API socket
    /// instead of naming donors. `ssd`, if given, is where reclaimed pages
    /// go home when no other donor has room.
    pub pool: Option<PathBuf>,
    /// A second home for every page (needs donors).
    pub redundancy: Redundancy,
    /// Keep pages that leave this machine in plain text (see [`Placement::open`]).
    pub no_encrypt: bool,
}

/// A store opened for a placement.
pub struct Opened {
    pub store: Arc<dyn PageStore>,
    pub pages: u64,
    /// For logs: "donor 10.0.0.2:7070", "3 donors", "file /var/tmp/...".
    pub describe: String,
    /// The layers under the store that keep second copies, for their
    /// health counters.
    pub copies: Copies,
}

/// The mirrors and erasure-coded stores under a store.
#[derive(Clone, Default)]
pub struct Copies {
    pub mirrors: Vec<Arc<memlend_store::layer::Mirror>>,
    pub erasures: Vec<Arc<memlend_store::layer::Erasure>>,
    /// Mirrors made while the store runs (leases added as a region fills).
    pub later: Arc<parking_lot::Mutex<Vec<Arc<memlend_store::layer::Mirror>>>>,
}

impl Copies {
    /// Their counters, summed (all zero without redundancy).
    pub fn stats(&self) -> memlend_store::layer::MirrorStats {
        redundant::sum_stats(self)
    }
}

impl Opened {
    pub fn mirror_stats(&self) -> memlend_store::layer::MirrorStats {
        self.copies.stats()
    }
}

impl Placement {
    /// Open a store of `pages` pages, or, when `None`, as many as the place
    /// has room for, up to [`DEFAULT_MAX_PAGES`]. Pages that go to donors
    /// are encrypted here (AES-256-GCM, a fresh key per slab that never
    /// leaves this process; `seal.rs`), so a donor holds only ciphertext,
    /// unless `no_encrypt`.
    pub fn open(&self, pages: Option<u64>) -> Result<Opened> {
        let mut opened = self.open_plain(pages)?;
        if self.encrypts() {
            opened.describe.push_str(", encrypted");
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
        if !matches!(self.redundancy, Redundancy::None | Redundancy::Ssd) && self.pool.is_some() {
            bail!(
                "--pool takes --redundancy ssd; {} over leases is not built yet",
                self.redundancy
            );
        }
        if let Some(api) = &self.pool {
            if !self.donors.is_empty() {
                bail!("give --pool or donors, not both");
            }
            let Some(pages) = pages else { bail!("borrowing from the cluster needs a size") };
            return pool::open(self, api, pages);
        }
        if !self.donors.is_empty() {
            if self.ssd.is_some() {
                bail!("give donors or an SSD path, not both");
            }
            return donors::open(self, pages);
        }
        let path = self.ssd.clone().unwrap_or_else(default_ssd_dir);
        ssd::open(&path, pages)
    }
}

/// Bytes free on every donor of `p` for a stripe (see [`Placement::open`]);
/// an error names a donor that cannot be reached or has no room.
pub fn room_on_donors(p: &Placement) -> Result<u64> {
    donors::room_bytes(p)
}

pub(crate) fn human_pages(pages: u64) -> String {
    memlend_node::size::human(pages * memlend_store::PAGE_SIZE as u64)
}

/// `$MEMLEND_SSD_DIR`, else `/var/tmp` (on disk, unlike a tmpfs `/tmp`).
pub fn default_ssd_dir() -> PathBuf {
    std::env::var_os("MEMLEND_SSD_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into())
}
