//! What `memlend run` tells the shim, through the environment. With no
//! `MEMLEND_LOCAL` the shim is inert and every call passes straight through.

use anyhow::{bail, Result};
use memlend_borrow::Placement;
use memlend_fault::Codec;
use std::path::PathBuf;

use memlend_borrow::env::{COMPRESS as ENV_COMPRESS, DEFAULT_THRESHOLD_BYTES};
use memlend_borrow::env::{FAR as ENV_FAR, LOCAL as ENV_LOCAL, MEM as ENV_MEM};
use memlend_borrow::env::{
    STATS_DIR as ENV_STATS_DIR, THRESHOLD as ENV_THRESHOLD, TRACE_DIR as ENV_TRACE_DIR,
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
    /// `lz4-all`, `zstd-all`: the pool takes every victim, not only reused
    /// ones.
    pub pool_admits_all: bool,
    /// `zstd`, `zstd-all`: the pool compresses with zstd, not lz4.
    pub pool_codec: Codec,
    /// The largest prefetch window, in pages (0: no prefetch); unset, the
    /// region's default. For measuring what prefetch gives a program.
    pub prefetch_pages_max: Option<usize>,
    /// The largest block a store fault reads around its page, in pages
    /// (below 2: none); unset, the region's default. For measuring too.
    pub read_block_pages_max: Option<usize>,
    /// Huge pages while every far page fits (`MEMLEND_HUGE_PAGES`).
    pub huge_pages: bool,
    /// A forked child sees far memory as at its fork (`MEMLEND_FOLLOW_FORK`);
    /// off, the region is MADV_DONTFORK and a child has none.
    pub follow_fork: bool,
    /// A fork's dirty pages are written after it (`MEMLEND_FORK_CLEAN`
    /// lazy, the default) or before it goes on (eager).
    pub lazy_fork_clean: bool,
    /// Where a forking process spills the old bytes it keeps for a child
    /// (`MEMLEND_FORK_SPILL_DIR`, /var/tmp when unset).
    pub fork_spill_dir: PathBuf,
    /// Faults read together share a store read.
    pub batch_fault_reads: bool,
    /// The whole process stays within this (`MEMLEND_MEM`): the far budget
    /// is what the rest of the process leaves of it.
    pub mem_bytes: Option<u64>,
    /// Record a page-access trace into `<dir>/<pid>.trace` (`MEMLEND_TRACE_DIR`).
    pub trace_dir: Option<PathBuf>,
    /// The shared-memory server (`MEMLEND_SHARED_SOCK`): shared anonymous
    /// mappings go far through it; unset, they pass to the kernel.
    pub shared_sock: Option<PathBuf>,
}

/// Read the config; `Ok(None)` when the shim is not asked to do anything.
/// The largest prefetch window in pages (0: none), for experiments.
const ENV_PREFETCH_MAX_PAGES: &str = "MEMLEND_PREFETCH_MAX_PAGES";

pub fn from_env() -> Result<Option<Config>> {
    let Some(local) = var(ENV_LOCAL) else { return Ok(None) };
    let local_bytes = bytes(ENV_LOCAL, &local)?;
    let far_bytes = var(ENV_FAR).map(|v| bytes(ENV_FAR, &v)).transpose()?;
    let threshold_bytes = match var(ENV_THRESHOLD) {
        Some(v) => bytes(ENV_THRESHOLD, &v)? as usize,
        None => DEFAULT_THRESHOLD_BYTES as usize,
    };
    let placement = memlend_borrow::env::placement_from_vars(var)?;
    let floor_bytes = (memlend_fault::BUDGET_FLOOR_PAGES * memlend_store::PAGE_SIZE) as u64;
    if local_bytes < floor_bytes {
        // One instruction may need several far pages at once (see the floor's doc).
        bail!("{ENV_LOCAL}={local}: the local budget must be at least {} KiB", floor_bytes >> 10);
    }
    let stats_dir = var(ENV_STATS_DIR).map(PathBuf::from);
    let (compress, pool_admits_all, pool_codec) = match var(ENV_COMPRESS).as_deref() {
        Some("lz4") => (true, false, Codec::Lz4),
        Some("lz4-all") => (true, true, Codec::Lz4),
        Some("zstd") => (true, false, Codec::Zstd),
        Some("zstd-all") => (true, true, Codec::Zstd),
        None | Some("off") => (false, false, Codec::Lz4),
        Some(other) => {
            bail!("{ENV_COMPRESS}={other}: expected lz4, lz4-all, zstd, zstd-all or off")
        }
    };
    let mem_bytes = var(ENV_MEM).map(|v| bytes(ENV_MEM, &v)).transpose()?;
    let prefetch_pages_max = pages(ENV_PREFETCH_MAX_PAGES)?;
    let read_block_pages_max = pages(memlend_borrow::env::READ_BLOCK_PAGES)?;
    let huge_pages = on_off(memlend_borrow::env::HUGE_PAGES)?;
    let follow_fork = match var(memlend_borrow::env::FOLLOW_FORK).as_deref() {
        Some("off") => false,
        None | Some("on") => true,
        Some(other) => bail!("{}={other}: expected on or off", memlend_borrow::env::FOLLOW_FORK),
    };
    let lazy_fork_clean = match var(memlend_borrow::env::FORK_CLEAN).as_deref() {
        None | Some("lazy") => true,
        Some("eager") => false,
        Some(other) => bail!("{}={other}: expected lazy or eager", memlend_borrow::env::FORK_CLEAN),
    };
    let batch_fault_reads = on_off(memlend_borrow::env::BATCH_FAULTS)?;
    Ok(Some(Config {
        batch_fault_reads,
        local_bytes,
        far_bytes,
        threshold_bytes,
        placement,
        stats_dir,
        compress,
        pool_admits_all,
        pool_codec,
        prefetch_pages_max,
        read_block_pages_max,
        huge_pages,
        follow_fork,
        lazy_fork_clean,
        fork_spill_dir: var(memlend_borrow::env::FORK_SPILL_DIR)
            .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from),
        mem_bytes,
        trace_dir: var(ENV_TRACE_DIR).map(PathBuf::from),
        shared_sock: var(memlend_borrow::env::SHARED_SOCK).map(PathBuf::from),
    }))
}

/// A switch that is on unless `name` says "off".
fn on_off(name: &str) -> Result<bool> {
    match var(name).as_deref() {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => bail!("{name}={other}: expected on or off"),
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A page count from `name`, if set.
fn pages(name: &str) -> Result<Option<usize>> {
    let Some(v) = var(name) else { return Ok(None) };
    let pages =
        v.parse::<usize>().map_err(|e| anyhow::anyhow!("{name}={v}: not a page count ({e})"))?;
    Ok(Some(pages))
}

fn bytes(name: &str, v: &str) -> Result<u64> {
    memlend_node::size::parse_size(v).map_err(|e| anyhow::anyhow!("{name}={v}: {e}"))
}
