//! Per-node cgroup v1 memory cgroups under memlend-lab/.

use super::names;
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

/// Make the node's memory cgroup with its limit.
pub fn make(node: &str, limit: u64) -> Result<()> {
    if !Path::new(names::CGROUP_MEMORY).join("memory.limit_in_bytes").exists() {
        bail!("no cgroup v1 memory controller at {}", names::CGROUP_MEMORY);
    }
    let dir = names::cgroup_dir(node);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = dir.join("memory.limit_in_bytes");
    fs::write(&file, limit.to_string())
        .with_context(|| format!("cannot set {} to {limit}", file.display()))
}

/// A number from one of the cgroup's files, e.g. memory.usage_in_bytes.
pub fn read_u64(node: &str, file: &str) -> Option<u64> {
    fs::read_to_string(names::cgroup_dir(node).join(file)).ok()?.trim().parse().ok()
}

pub fn procs(node: &str) -> Vec<i32> {
    let text = fs::read_to_string(names::cgroup_dir(node).join("cgroup.procs")).unwrap_or_default();
    text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Lab cgroup directories named `<prefix>-n<i>`.
pub fn lab_cgroups(prefix: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(names::CGROUP_PARENT) else { return Vec::new() };
    let names = entries.flatten().filter_map(|e| e.file_name().into_string().ok());
    names.filter(|n| names::is_indexed(n, prefix, "-n")).collect()
}

/// Remove a node's cgroup. rmdir fails while a process is inside, so any
/// straggler still there (the caller has already killed what it could) is
/// moved to the root cgroup first. Retries for up to 2 s because exiting
/// processes leave the cgroup a moment after they die.
pub fn remove(node: &str) -> Result<()> {
    let dir = names::cgroup_dir(node);
    let root_procs = Path::new(names::CGROUP_MEMORY).join("cgroup.procs");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        for pid in procs(node) {
            let _ = fs::write(&root_procs, pid.to_string());
        }
        match fs::remove_dir(&dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(e).with_context(|| format!("cannot remove {}", dir.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Remove memlend-lab/ itself once no lab uses it (another lab's nodes
/// keep it busy, which is fine).
pub fn remove_parent_if_empty() {
    let _ = fs::remove_dir(names::CGROUP_PARENT);
}
