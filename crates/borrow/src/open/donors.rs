//! Pages on donors: one slab on one donor, or a stripe with one slab on each.

use crate::{Opened, Placement, DEFAULT_MAX_PAGES, STRIPE_CHUNK_PAGES};
use anyhow::{bail, Context, Result};
use memlend_remote::{ClientConfig, Conn};
use memlend_store::layer::Stripe;
use memlend_store::PageStore;
use memlend_wire::page::{Opcode, ReqHeader, StatReply};
use std::net::SocketAddr;
use std::sync::Arc;

pub fn open(p: &Placement, pages: Option<u64>) -> Result<Opened> {
    let cfg = client_config(p)?;
    let n = p.donors.len() as u64;
    let each = match pages {
        Some(pages) => pages.div_ceil(n * STRIPE_CHUNK_PAGES) * STRIPE_CHUNK_PAGES,
        None => room_on_each(&p.donors, &cfg)?,
    };
    let encrypt = p.encrypts();
    if n == 1 {
        let addr = p.donors[0];
        let store = open_slab(addr, &cfg, pages.unwrap_or(each), encrypt)?;
        let pages = store.info().pages;
        let describe = format!("donor {addr}");
        return Ok(Opened::new(store, pages, describe, Default::default()));
    }
    let mut stores: Vec<Arc<dyn PageStore>> = Vec::new();
    for &addr in &p.donors {
        stores.push(open_slab(addr, &cfg, each, encrypt)?);
    }
    let store = Stripe::new(stores, STRIPE_CHUNK_PAGES)?;
    let pages = pages.unwrap_or(store.info().pages);
    let describe = format!("{n} donors, striped");
    Ok(Opened::new(Arc::new(store), pages, describe, Default::default()))
}

/// Bytes a stripe over the donors can hold now: the least free donor's
/// room on each. Fails, naming the donor, if one cannot be reached.
pub fn room_bytes(p: &Placement) -> Result<u64> {
    let each = room_on_each(&p.donors, &client_config(p)?)?;
    Ok(each * p.donors.len() as u64 * memlend_store::PAGE_SIZE as u64)
}

pub(crate) fn client_config(p: &Placement) -> Result<ClientConfig> {
    let key = p.key.as_deref().map(memlend_node::keyfile::load).transpose()?;
    if key.is_none() && !p.insecure {
        bail!("donors need the cluster key (--key FILE), or --insecure for keyless donors");
    }
    let mut cfg = ClientConfig::new(key);
    cfg.allow_insecure = p.insecure;
    cfg.spin_before_sleep = p.reply_spin();
    Ok(cfg)
}

fn open_slab(
    addr: SocketAddr,
    cfg: &ClientConfig,
    pages: u64,
    encrypt: bool,
) -> Result<Arc<dyn PageStore>> {
    let slab = crate::seal::open(addr, cfg, pages, encrypt)
        .with_context(|| format!("cannot open {} on donor {addr}", size(pages)))?;
    crate::seal::wrap(slab, encrypt)
}

/// Pages each donor can still promise, whole stripe chunks, for an even
/// stripe: the least free donor decides.
pub(crate) fn room_on_each(donors: &[SocketAddr], cfg: &ClientConfig) -> Result<u64> {
    let mut least = u64::MAX;
    for &addr in donors {
        least = least.min(free_pages(addr, cfg)?);
    }
    let cap = DEFAULT_MAX_PAGES / donors.len() as u64;
    let each = least.min(cap) / STRIPE_CHUNK_PAGES * STRIPE_CHUNK_PAGES;
    if each == 0 {
        bail!("the donors have no room left ({} free on the fullest)", size(least));
    }
    Ok(each)
}

fn free_pages(addr: SocketAddr, cfg: &ClientConfig) -> Result<u64> {
    let mut conn =
        Conn::connect(addr, cfg).with_context(|| format!("cannot reach donor {addr}"))?;
    conn.call(ReqHeader::new(Opcode::Stat, 0), &[], None)
        .with_context(|| format!("donor {addr} did not answer STAT"))?;
    Ok(StatReply::decode(conn.scratch())?.free_pages)
}

fn size(pages: u64) -> String {
    memlend_node::size::human(pages * memlend_store::PAGE_SIZE as u64)
}
