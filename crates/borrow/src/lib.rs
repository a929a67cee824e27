//! Borrowing far memory: where a region keeps its pages, chosen when it is
//! created, and, when they are on leases from the cluster, the agent that
//! follows those leases while the region lives. Two wings:
//!
//! - [`open`]: opening a far store for a [`Placement`]: one donor, a stripe
//!   over several, a second home for every page (redundancy), leases from
//!   the cluster cut into segments, or a file on local SSD (NEC's "SSD as
//!   memory", and the default when no donor is named);
//! - [`lease`]: the lease agent, one thread per region borrowed from the
//!   cluster: grants, growth as the region fills, reclaims, lost leases,
//!   and the way back to a lease for pages that went home.
//!
//! [`env`] carries a placement through the environment, from `memlend run`
//! to its preload shim. Every front door (`memlend far`, `memlend run`'s
//! preload shim, the C ABI and Python) opens its store here, so they size,
//! name and clean up stores the same way.

pub mod env;
pub mod lease;
pub mod open;
mod seal;
mod ssd;

use memlend_store::layer::registry::Report;
use memlend_store::layer::Stack;
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
    /// Named layers over the store, outermost first (`--layers checksum,stats`).
    pub layers: Stack,
    /// How long a connection to a donor polls for a reply before sleeping
    /// (`None`: `REPLY_SPIN_US`; `auto`: that where a wake is dear, else 0).
    pub reply_spin: Option<memlend_net::SpinSetting>,
}

/// A donor's reply usually comes within ~15 µs on loopback, and polling
/// for it costs only the wait's own core. Measured with the guest's halt
/// polling on (wakes cheap, `bench/results/hp_C200.json`): redis at a
/// quarter local ran 34.5 K ops/s with it and 31.4 K without, so it stays
/// on where `auto` would turn it off.
pub const REPLY_SPIN_US: u64 = 50;

impl Placement {
    /// The reply spin to use.
    pub fn reply_spin(&self) -> std::time::Duration {
        self.reply_spin
            .unwrap_or(memlend_net::SpinSetting::Us(REPLY_SPIN_US))
            .resolve(REPLY_SPIN_US)
    }
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
    /// What the named layers (`Placement::layers`) say at the end of a run.
    pub reports: Vec<Report>,
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
        open::redundant::sum_stats(self)
    }
}

impl Opened {
    /// A store as opened, before the named layers go on.
    pub fn new(store: Arc<dyn PageStore>, pages: u64, describe: String, copies: Copies) -> Self {
        Opened { store, pages, describe, copies, reports: Vec::new() }
    }

    pub fn mirror_stats(&self) -> memlend_store::layer::MirrorStats {
        self.copies.stats()
    }
}

pub(crate) fn human_pages(pages: u64) -> String {
    memlend_node::size::human(pages * memlend_store::PAGE_SIZE as u64)
}

/// `$MEMLEND_SSD_DIR`, else `/var/tmp` (on disk, unlike a tmpfs `/tmp`).
pub fn default_ssd_dir() -> PathBuf {
    std::env::var_os("MEMLEND_SSD_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into())
}

/// A page's second home.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Redundancy {
    /// One copy: a donor that dies takes its pages with it.
    #[default]
    None,
    /// Two donors hold every page.
    Mirror,
    /// A donor and a local SSD file hold every page.
    Ssd,
    /// Pages spread over n-m donors with m parity donors (m = 2 from five
    /// donors, else 1): any m may fail, for n/(n-m) of the memory.
    Erasure,
}

impl std::str::FromStr for Redundancy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Redundancy> {
        match s {
            "none" => Ok(Redundancy::None),
            "mirror" => Ok(Redundancy::Mirror),
            "ssd" => Ok(Redundancy::Ssd),
            "erasure" => Ok(Redundancy::Erasure),
            _ => anyhow::bail!("redundancy {s:?}: expected none, mirror, ssd or erasure"),
        }
    }
}

impl std::fmt::Display for Redundancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Redundancy::None => "none",
            Redundancy::Mirror => "mirror",
            Redundancy::Ssd => "ssd",
            Redundancy::Erasure => "erasure",
        })
    }
}
