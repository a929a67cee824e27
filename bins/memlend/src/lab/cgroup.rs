//! Per-node memory cgroups under memlend-lab/, in this host's hierarchy
//! (cgroup v1's memory controller, or v2's unified hierarchy:
//! `memlend_host::cgroup`).

use super::names;
use anyhow::{Context, Result};
use memlend_host::cgroup::{File, Hierarchy};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The host's memory hierarchy, found once.
pub fn hierarchy() -> Result<&'static Hierarchy> {
    static FOUND: OnceLock<Option<Hierarchy>> = OnceLock::new();
    FOUND.get_or_init(Hierarchy::detect).as_ref().context(
        "no memory cgroup hierarchy: neither cgroup v1's memory controller at \
         /sys/fs/cgroup/memory nor cgroup v2 with the memory controller at /sys/fs/cgroup",
    )
}

fn rel(node: &str) -> String {
    format!("{}/{node}", names::CGROUP_PARENT)
}

/// The node's cgroup directory (in a hierarchy that may not exist: then
/// under v1's, where nothing will be found).
pub fn dir(node: &str) -> PathBuf {
    match hierarchy() {
        Ok(h) => h.dir(&rel(node)),
        Err(_) => PathBuf::from("/sys/fs/cgroup/memory").join(rel(node)),
    }
}

/// Make the node's memory cgroup with its limit.
pub fn make(node: &str, limit: u64) -> Result<()> {
    hierarchy()?.make(&rel(node), limit).map(|_| ())
}

/// A number from one of the cgroup's files.
pub fn read_u64(node: &str, file: File) -> Option<u64> {
    hierarchy().ok()?.read_u64(&rel(node), file)
}

pub fn procs(node: &str) -> Vec<i32> {
    hierarchy().map(|h| h.procs(&rel(node))).unwrap_or_default()
}

/// Lab cgroup directories named `<prefix>-n<i>`.
pub fn lab_cgroups(prefix: &str) -> Vec<String> {
    let Ok(h) = hierarchy() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(h.dir(names::CGROUP_PARENT)) else { return Vec::new() };
    let names = entries.flatten().filter_map(|e| e.file_name().into_string().ok());
    names.filter(|n| names::is_indexed(n, prefix, "-n")).collect()
}

/// Remove a node's cgroup; any straggler still inside (the caller has
/// already killed what it could) is moved to the root first.
pub fn remove(node: &str) -> Result<()> {
    hierarchy()?.remove(&rel(node))
}

/// Remove memlend-lab/ itself once no lab uses it (another lab's nodes
/// keep it busy, which is fine).
pub fn remove_parent_if_empty() {
    if let Ok(h) = hierarchy() {
        let _ = std::fs::remove_dir(h.dir(names::CGROUP_PARENT));
    }
}
