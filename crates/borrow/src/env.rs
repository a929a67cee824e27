//! The environment through which `memlend run` configures its preload shim
//! in the program it starts (and in every program that one execs).

/// Local budget in bytes; the shim does nothing without it.
pub const LOCAL: &str = "MEMLEND_LOCAL";
/// Far region size in bytes; default: what the placement has room for.
pub const FAR: &str = "MEMLEND_FAR";
/// Comma-separated donor addresses.
pub const DONORS: &str = "MEMLEND_DONORS";
/// The local memlendd's API socket: borrow from the cluster.
pub const POOL: &str = "MEMLEND_POOL";
/// SSD path (file, directory or block device) when there are no donors.
pub const SSD: &str = "MEMLEND_SSD";
/// "mirror" or "ssd": a second home for every page.
pub const REDUNDANCY: &str = "MEMLEND_REDUNDANCY";
/// "1": pages go to donors in plain text.
pub const NO_ENCRYPT: &str = "MEMLEND_NO_ENCRYPT";
/// Named layers over the far store, outermost first ("checksum,stats").
pub const LAYERS: &str = "MEMLEND_LAYERS";
/// Cluster key file.
pub const KEY: &str = "MEMLEND_KEY";
/// `memlend run --spin-us`: microseconds a connection polls for a donor's
/// reply before sleeping, or `auto`; unset: `crate::REPLY_SPIN_US`.
pub const REPLY_SPIN_US: &str = "MEMLEND_REPLY_SPIN_US";
/// "1": donors without a key are fine.
pub const INSECURE: &str = "MEMLEND_INSECURE";
/// Allocations from this many bytes up are far.
pub const THRESHOLD: &str = "MEMLEND_THRESHOLD";
/// With a pool: the first lease's size (`64M`); later ones double, up to
/// 2 GiB, each leased when the region first writes to it.
pub const LEASE_FIRST: &str = "MEMLEND_LEASE_FIRST";
/// Total memory of the process in bytes (`memlend run --mem`): the far
/// budget follows what the rest of the process uses, to stay within it.
pub const MEM: &str = "MEMLEND_MEM";
/// "lz4" or "off" (the default): keep evicted pages that compress in a
/// local pool carved from the budget.
pub const COMPRESS: &str = "MEMLEND_COMPRESS";
/// The largest aligned block, in pages, a store fault reads around its page
/// (below 2: none); see `memlend_fault::Tuning::read_block_pages_max`.
pub const READ_BLOCK_PAGES: &str = "MEMLEND_READ_BLOCK_PAGES";
/// "on" (the default) or "off": while every far page fits the budget,
/// collapse full 2 MiB chunks into huge pages (`memlend_fault::Tuning::huge_pages`).
pub const HUGE_PAGES: &str = "MEMLEND_HUGE_PAGES";
/// `memlend run --follow-fork`: `on` (the default) or `off`.
pub const FOLLOW_FORK: &str = "MEMLEND_FOLLOW_FORK";
/// `memlend run --fork-clean`: `lazy` (the default) or `eager`.
pub const FORK_CLEAN: &str = "MEMLEND_FORK_CLEAN";
/// `memlend run --fork-spill`: the directory where a forked child's parent
/// keeps the old bytes of pages it rewrites (an unlinked file; /var/tmp
/// when unset).
pub const FORK_SPILL_DIR: &str = "MEMLEND_FORK_SPILL_DIR";
/// "on" (the default) or "off": faults read together share a store read
/// (`memlend_fault::Tuning::batch_fault_reads`).
pub const BATCH_FAULTS: &str = "MEMLEND_BATCH_FAULTS";
/// Directory for a page-access trace of each process, `<pid>.trace`; a
/// tracing process keeps a tiny budget (see `memlend_fault::trace`).
pub const TRACE_DIR: &str = "MEMLEND_TRACE_DIR";
/// Directory for each process's `<pid>.json` counters at exit.
pub const STATS_DIR: &str = "MEMLEND_STATS_DIR";
/// The socket of `memlend run`'s shared-memory server: shared anonymous
/// mappings from the threshold up are made far through it.
pub const SHARED_SOCK: &str = "MEMLEND_SHARED_SOCK";

/// Far allocations start at this size unless told otherwise.
pub const DEFAULT_THRESHOLD_BYTES: u64 = 1 << 20;

use crate::{Placement, Redundancy};
use anyhow::{Context, Result};
use memlend_net::SpinSetting;
use std::path::PathBuf;

/// A placement as the variables that carry it: each name with its value,
/// or `None` for a variable to remove (so that a value inherited from the
/// parent does not leak through). Paths must already be absolute: the
/// program may change directory before its first large allocation.
pub fn placement_vars(p: &Placement) -> [(&'static str, Option<String>); 9] {
    let donors: Vec<String> = p.donors.iter().map(|d| d.to_string()).collect();
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    [
        (DONORS, (!donors.is_empty()).then(|| donors.join(","))),
        (SSD, path(&p.ssd)),
        (KEY, path(&p.key)),
        (INSECURE, p.insecure.then(|| "1".to_string())),
        (POOL, path(&p.pool)),
        (REDUNDANCY, (p.redundancy != Redundancy::None).then(|| p.redundancy.to_string())),
        (NO_ENCRYPT, p.no_encrypt.then(|| "1".to_string())),
        (LAYERS, (!p.layers.is_empty()).then(|| p.layers.to_string())),
        (REPLY_SPIN_US, p.reply_spin.map(|s| s.to_string())),
    ]
}

/// The placement [`placement_vars`] wrote, read back through `var` (which
/// gives a variable's value, `None` for unset or empty).
pub fn placement_from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Placement> {
    let donors = match var(DONORS) {
        Some(list) => list
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().with_context(|| format!("{DONORS}: bad address {s:?}")))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    Ok(Placement {
        donors,
        ssd: var(SSD).map(PathBuf::from),
        key: var(KEY).map(PathBuf::from),
        insecure: var(INSECURE).is_some_and(|v| v == "1"),
        pool: var(POOL).map(PathBuf::from),
        redundancy: match var(REDUNDANCY) {
            Some(v) => v.parse().with_context(|| format!("{REDUNDANCY}={v}"))?,
            None => Redundancy::None,
        },
        no_encrypt: var(NO_ENCRYPT).is_some_and(|v| v == "1"),
        layers: match var(LAYERS) {
            Some(v) => v.parse().with_context(|| format!("{LAYERS}={v}"))?,
            None => Default::default(),
        },
        reply_spin: match var(REPLY_SPIN_US) {
            Some(v) => Some(
                v.parse::<SpinSetting>().map_err(|e| anyhow::anyhow!("{REPLY_SPIN_US}: {e}"))?,
            ),
            None => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_placement_reads_back_as_written() {
        let p = Placement {
            donors: vec!["10.0.0.2:7070".parse().unwrap(), "[::1]:7071".parse().unwrap()],
            ssd: Some(PathBuf::from("/var/tmp/far")),
            key: Some(PathBuf::from("/etc/memlend/key")),
            insecure: false,
            pool: None,
            redundancy: Redundancy::Mirror,
            no_encrypt: true,
            layers: "checksum,stats".parse().unwrap(),
            reply_spin: Some(SpinSetting::Us(20)),
        };
        let vars: HashMap<&str, Option<String>> = placement_vars(&p).into_iter().collect();
        assert_eq!(vars[POOL], None, "unset, not empty");
        let back = placement_from_vars(|name| vars.get(name).cloned().flatten()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{p:?}"));
    }

    #[test]
    fn an_unknown_layer_is_an_error_that_names_the_variable() {
        let err = placement_from_vars(|n| (n == LAYERS).then(|| "checksum,zip".to_string()));
        let msg = format!("{:#}", err.unwrap_err());
        assert!(msg.contains(LAYERS) && msg.contains("\"zip\" is not a layer"), "{msg}");
    }

    #[test]
    fn a_bad_donor_address_is_an_error_that_names_the_variable() {
        let err = placement_from_vars(|n| (n == DONORS).then(|| "10.0.0.2".to_string()));
        assert!(format!("{:#}", err.unwrap_err()).contains(DONORS));
    }
}
