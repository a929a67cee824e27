//! What `memlend run` tells the shim, through the environment. With no
//! `MEMLEND_LOCAL` the shim is inert and every call passes straight through.

use anyhow::{bail, Context, Result};
use memlend_place::Placement;
use std::path::PathBuf;

use memlend_place::env::{COMPRESS as ENV_COMPRESS, DEFAULT_THRESHOLD_BYTES};
use memlend_place::env::{DONORS as ENV_DONORS, FAR as ENV_FAR, MEM as ENV_MEM};
use memlend_place::env::{INSECURE as ENV_INSECURE, KEY as ENV_KEY, LOCAL as ENV_LOCAL};
use memlend_place::env::{NO_ENCRYPT as ENV_NO_ENCRYPT, REDUNDANCY as ENV_REDUNDANCY};
use memlend_place::env::{
    POOL as ENV_POOL, SSD as ENV_SSD, STATS_DIR as ENV_STATS_DIR, THRESHOLD as ENV_THRESHOLD,
};

#[derive(Debug)]
pub struct Config {
    /// Local budget: most far pages resident at once.
    pub local_bytes: u64,
    /// Size of the far region; `None` = what the placement has room for.
    pub far_bytes: Option<u64>,
    pub threshold_bytes: usize,
    pub placement: Placement,
    /// Where to leave `<pid>.json` with the region's counters at exit.
    pub stats_dir: Option<PathBuf>,
    /// Keep evicted pages that compress in a local pool (`MEMLEND_COMPRESS`).
    pub compress: bool,
    /// The whole process stays within this (`MEMLEND_MEM`): the far budget
    /// is what the rest of the process leaves of it.
    pub mem_bytes: Option<u64>,
}

/// Read the config; `Ok(None)` when the shim is not asked to do anything.
pub fn from_env() -> Result<Option<Config>> {
    let Some(local) = var(ENV_LOCAL) else { return Ok(None) };
    let local_bytes = bytes(ENV_LOCAL, &local)?;
    let far_bytes = var(ENV_FAR).map(|v| bytes(ENV_FAR, &v)).transpose()?;
    let threshold_bytes = match var(ENV_THRESHOLD) {
        Some(v) => bytes(ENV_THRESHOLD, &v)? as usize,
        None => DEFAULT_THRESHOLD_BYTES as usize,
    };
    let donors = match var(ENV_DONORS) {
        Some(list) => list
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().with_context(|| format!("{ENV_DONORS}: bad address {s:?}")))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let placement = Placement {
        donors,
        ssd: var(ENV_SSD).map(PathBuf::from),
        key: var(ENV_KEY).map(PathBuf::from),
        insecure: var(ENV_INSECURE).is_some_and(|v| v == "1"),
        pool: var(ENV_POOL).map(PathBuf::from),
        redundancy: match var(ENV_REDUNDANCY) {
            Some(v) => v.parse().with_context(|| format!("{ENV_REDUNDANCY}={v}"))?,
            None => Default::default(),
        },
        no_encrypt: var(ENV_NO_ENCRYPT).is_some_and(|v| v == "1"),
    };
    if local_bytes < 4096 {
        bail!("{ENV_LOCAL}={local}: the local budget must be at least one page");
    }
    let stats_dir = var(ENV_STATS_DIR).map(PathBuf::from);
    let compress = match var(ENV_COMPRESS).as_deref() {
        Some("lz4") => true,
        None | Some("off") => false,
        Some(other) => bail!("{ENV_COMPRESS}={other}: expected lz4 or off"),
    };
    let mem_bytes = var(ENV_MEM).map(|v| bytes(ENV_MEM, &v)).transpose()?;
    Ok(Some(Config {
        local_bytes,
        far_bytes,
        threshold_bytes,
        placement,
        stats_dir,
        compress,
        mem_bytes,
    }))
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn bytes(name: &str, v: &str) -> Result<u64> {
    memlend_node::size::parse_size(v).map_err(|e| anyhow::anyhow!("{name}={v}: {e}"))
}
