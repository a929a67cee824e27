//! Pages with a second home: mirrored on two donors, or written through to a
//! local SSD file as well as a donor (Infiniswap's backup disk). A donor
//! that dies, stops or drops off costs a pause of about a second, never a
//! page; the lost copy is rebuilt on another donor in the background.
//!
//! Layout over n donors. `mirror`: n = 2 gives one mirror; n >= 3 a stripe
//! of n mirrors, mirror k on donors k and k+1 (chained declustering), so
//! each donor holds two slabs and a dead donor's load spreads over two
//! others. `ssd`: a stripe of n mirrors, each a donor slab read first and an
//! SSD file behind it. `erasure`: one slab per donor, n-m of data and m of
//! parity (`layer::erasure`).

use super::donors;
use crate::{Opened, Placement, Redundancy, STRIPE_CHUNK_PAGES};
use anyhow::{bail, Context, Result};
use memlend_remote::ClientConfig;
use memlend_store::layer::mirror::{SpareFn, SpareRequest};
use memlend_store::layer::{Erasure, Mirror, MirrorOptions, MirrorStats, Stripe};
use memlend_store::{PageStore, StoreError};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long a redundant leg may take to answer before it counts as failed
/// and the mirror reads elsewhere: the pause a dead or stopped donor costs.
pub const LEG_IO_TIMEOUT: Duration = Duration::from_millis(800);

/// Label of a leg on the local SSD.
const SSD_LABEL: &str = "ssd";

/// Open `pages` pages (or as many as fit) with a second home for each.
pub fn open(p: &Placement, pages: Option<u64>) -> Result<Opened> {
    let n = p.donors.len();
    if p.redundancy == Redundancy::Erasure {
        return erasure(p, pages);
    }
    if p.redundancy == Redundancy::Mirror && n < 2 {
        bail!("--redundancy mirror needs at least two donors");
    }
    let cfg = leg_config(donors::client_config(p)?);
    let count = if p.redundancy == Redundancy::Mirror && n == 2 { 1 } else { n as u64 };
    let each = match pages {
        Some(pages) => pages.div_ceil(count * STRIPE_CHUNK_PAGES) * STRIPE_CHUNK_PAGES,
        // Chained, each donor holds slabs of two mirrors.
        None => {
            donors::room_on_each(&p.donors, &cfg)? / 2 / STRIPE_CHUNK_PAGES * STRIPE_CHUNK_PAGES
        }
    };
    let spares = Arc::new(Spares::new(p, cfg));
    let mut made: Vec<Arc<Mirror>> = Vec::new();
    for k in 0..count as usize {
        made.push(Arc::new(mirror(p, &spares, k, each)?));
    }
    let describe = format!("{n} donor(s), redundancy {}", p.redundancy);
    let stores: Vec<Arc<dyn PageStore>> =
        made.iter().map(|m| Arc::clone(m) as Arc<dyn PageStore>).collect();
    let store: Arc<dyn PageStore> = match stores.len() {
        1 => Arc::clone(&stores[0]),
        _ => Arc::new(Stripe::new(stores, STRIPE_CHUNK_PAGES)?),
    };
    let pages = pages.unwrap_or(store.info().pages);
    let copies = crate::Copies { mirrors: made, ..crate::Copies::default() };
    Ok(Opened::new(store, pages, describe, copies))
}

/// Parity donors for `n` donors.
pub fn parity_legs(n: usize) -> usize {
    if n >= 5 {
        2
    } else {
        1
    }
}

/// One slab on every donor: n-m data legs, m parity legs.
fn erasure(p: &Placement, pages: Option<u64>) -> Result<Opened> {
    let n = p.donors.len();
    if n < 3 {
        bail!("--redundancy erasure needs at least three donors (two data, one parity)");
    }
    let (k, m) = (n - parity_legs(n), parity_legs(n));
    let cfg = leg_config(donors::client_config(p)?);
    let per_leg = match pages {
        Some(pages) => pages.div_ceil(k as u64),
        None => donors::room_on_each(&p.donors, &cfg)?,
    };
    let spares = Arc::new(Spares::new(p, cfg));
    let mut legs = Vec::new();
    for &addr in &p.donors {
        legs.push((spares.slab(addr, per_leg)?, addr.to_string()));
    }
    let parity = legs.split_off(k);
    let pages = pages.unwrap_or(per_leg * k as u64);
    let spare: SpareFn = Box::new(move |req| spares.spare(req, true));
    let e = Arc::new(Erasure::new(legs, parity, pages, Some(spare))?);
    let describe = format!("{n} donors, erasure coded {k}+{m}");
    let copies = crate::Copies { erasures: vec![Arc::clone(&e)], ..crate::Copies::default() };
    Ok(Opened::new(e, pages, describe, copies))
}

/// Mirror number `k`: its two legs and where its spares come from.
fn mirror(p: &Placement, spares: &Arc<Spares>, k: usize, pages: u64) -> Result<Mirror> {
    let first = p.donors[k];
    let a = (spares.slab(first, pages)?, first.to_string());
    let b = match p.redundancy {
        Redundancy::Ssd => (spares.ssd_file(pages)?, SSD_LABEL.to_string()),
        _ => {
            let second = p.donors[(k + 1) % p.donors.len()];
            (spares.slab(second, pages)?, second.to_string())
        }
    };
    let spread_reads = p.redundancy == Redundancy::Mirror;
    let opts = MirrorOptions { spread_reads, ..MirrorOptions::default() };
    let spares = Arc::clone(spares);
    let ssd_fallback = p.redundancy == Redundancy::Mirror;
    let spare: SpareFn = Box::new(move |req| spares.spare(req, ssd_fallback));
    Ok(Mirror::new(vec![a, b], pages, opts, Some(spare))?)
}

/// A connection to a leg's donor may take this long: over one SYN
/// retransmission (1 s), so that one lost packet does not drop a copy.
const LEG_CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Attempts to open a leg's slab; a lossy network may eat a handshake.
const OPEN_ATTEMPTS: u32 = 3;

/// A redundant leg gives up quickly: the other copy is there.
pub(crate) fn leg_config(mut cfg: ClientConfig) -> ClientConfig {
    cfg.io_timeout = LEG_IO_TIMEOUT;
    cfg.connect_timeout = LEG_CONNECT_TIMEOUT;
    cfg.retries_max = 0;
    cfg
}

fn ssd_dir(p: &Placement) -> PathBuf {
    p.ssd.clone().unwrap_or_else(crate::default_ssd_dir)
}

/// Where new legs come from.
struct Spares {
    donors: Vec<SocketAddr>,
    cfg: ClientConfig,
    ssd: PathBuf,
    /// Legs on donors are encrypted, each under its own key.
    encrypt: bool,
}

impl Spares {
    fn new(p: &Placement, cfg: ClientConfig) -> Spares {
        Spares { donors: p.donors.clone(), cfg, ssd: ssd_dir(p), encrypt: p.encrypts() }
    }

    fn slab(&self, addr: SocketAddr, pages: u64) -> Result<Arc<dyn PageStore>> {
        let mut attempt = 1;
        loop {
            match crate::seal::open(addr, &self.cfg, pages, self.encrypt) {
                Ok(store) => return crate::seal::wrap(store, self.encrypt),
                Err(e) if e.is_transport() && attempt < OPEN_ATTEMPTS => {
                    tracing::warn!(%addr, error = %e, attempt, "opening a copy failed; again");
                    attempt += 1;
                }
                Err(e) => {
                    let size = crate::human_pages(pages);
                    return Err(e).with_context(|| format!("cannot open {size} on donor {addr}"));
                }
            }
        }
    }

    fn ssd_file(&self, pages: u64) -> Result<Arc<dyn PageStore>> {
        Ok(crate::ssd::open(&self.ssd, Some(pages))?.store)
    }

    /// A donor not in `avoid` with room; else, when allowed, the SSD.
    fn spare(
        &self,
        req: &SpareRequest,
        ssd_fallback: bool,
    ) -> Result<(Arc<dyn PageStore>, String), StoreError> {
        let mut why = Vec::new();
        for &addr in &self.donors {
            let label = addr.to_string();
            if req.avoid.contains(&label) {
                continue;
            }
            match self.slab(addr, req.pages) {
                Ok(store) => return Ok((store, label)),
                Err(e) => why.push(format!("{e:#}")),
            }
        }
        if ssd_fallback && !req.avoid.iter().any(|l| l == SSD_LABEL) {
            tracing::warn!("no other donor can hold a copy; keeping it on the local SSD");
            let store = self.ssd_file(req.pages).map_err(|e| unavailable(format!("{e:#}")))?;
            return Ok((store, SSD_LABEL.to_string()));
        }
        why.push("no other donor is named".into());
        Err(unavailable(why.join("; ")))
    }
}

fn unavailable(why: String) -> StoreError {
    StoreError::Unavailable(why)
}

/// Counters of several mirrors and erasure-coded stores, summed;
/// `rebuilding` if any is.
pub fn sum_stats(copies: &crate::Copies) -> MirrorStats {
    let mut t = MirrorStats::default();
    for e in copies.erasures.iter().map(|e| e.stats()) {
        let legs = e.data_legs + e.parity_legs;
        t.legs += legs;
        t.healthy_legs += e.healthy_legs;
        t.leg_failures += e.leg_failures;
        t.last_leg_errors += e.kept_leg_errors;
        t.rebuilds += e.rebuilds;
        t.pages_rebuilt += e.pages_rebuilt;
        t.rebuilding |= e.healthy_legs < legs && e.leg_failures > e.rebuilds;
        t.bad_copies += e.bad_copies;
        t.lost_pages += e.lost_pages;
    }
    let later = copies.later.lock().clone();
    for s in copies.mirrors.iter().chain(&later).map(|m| m.stats()) {
        t.legs += s.legs;
        t.healthy_legs += s.healthy_legs;
        t.leg_failures += s.leg_failures;
        t.last_leg_errors += s.last_leg_errors;
        t.bad_copies += s.bad_copies;
        t.repaired_pages += s.repaired_pages;
        t.lost_pages += s.lost_pages;
        t.rebuilds += s.rebuilds;
        t.pages_rebuilt += s.pages_rebuilt;
        t.rebuilding |= s.rebuilding;
    }
    t
}
