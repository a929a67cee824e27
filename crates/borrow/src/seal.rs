//! Pages that leave this machine are encrypted here, slab by slab: each
//! donor slab gets its own `Crypt` with a fresh random key that never leaves
//! this process, and keeps the tags on the donor beside the ciphertext
//! (a sealed slab). What stays here is the version of each page, 6 bytes,
//! which is what catches a donor that hands back an older page.
//!
//! Per slab rather than once over the whole region, because the tags must
//! travel with the pages: every layer above a slab (stripe, mirror, erasure,
//! the leases' concat and relocation) moves plain pages only. The cost is
//! one encryption per copy under a mirror or erasure code (~0.6 µs a page).
//! Pages on the local SSD tier are not encrypted: they never leave the
//! machine (use dm-crypt under the SSD directory if its disk must not hold
//! plain pages).

use anyhow::{Context, Result};
use memlend_remote::{ClientConfig, ClientError, RemoteStore};
use memlend_store::layer::Crypt;
use memlend_store::PageStore;
use std::net::SocketAddr;
use std::sync::Arc;

/// Open a slab of `pages` on `addr`: sealed when its pages will be
/// encrypted, so that the donor keeps their tags.
pub(crate) fn open(
    addr: SocketAddr,
    cfg: &ClientConfig,
    pages: u64,
    encrypt: bool,
) -> Result<RemoteStore, ClientError> {
    if encrypt {
        RemoteStore::open_sealed(addr, cfg.clone(), pages)
    } else {
        RemoteStore::open(addr, cfg.clone(), pages)
    }
}

/// The slab as the region sees it: encrypted under a fresh key, or as is.
pub(crate) fn wrap(slab: RemoteStore, encrypt: bool) -> Result<Arc<dyn PageStore>> {
    if !encrypt {
        return Ok(Arc::new(slab));
    }
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key)
        .map_err(|e| anyhow::anyhow!("no random key for page encryption: {e}"))?;
    let addr = slab.addr();
    let store = Crypt::new(slab, key).with_context(|| format!("encrypting a slab on {addr}"))?;
    Ok(Arc::new(store))
}
