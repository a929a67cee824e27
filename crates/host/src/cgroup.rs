//! Memory cgroups behind one interface, v1 or v2: where the hierarchy is,
//! what its files are called, and making, limiting, reading and removing a
//! cgroup in it. The lab's nodes use it; the monitor (`pool::monitor`) and
//! `meminfo::cgroup_room` read both layouts through the same names.
//!
//! Differences that matter: v2 has one hierarchy whose controllers a parent
//! hands down (`+memory` in its `cgroup.subtree_control`) and in which a
//! cgroup with children holds no processes; "no limit" reads `max`; v2's
//! `memory.swap.max` limits swap alone, v1's `memory.memsw.limit_in_bytes`
//! memory plus swap.

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const V1_ROOT: &str = "/sys/fs/cgroup/memory";
const V2_ROOT: &str = "/sys/fs/cgroup";
/// How long `remove` retries: exiting processes leave a cgroup a moment
/// after they die.
const REMOVE_WAIT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// A cgroup file, by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum File {
    Limit,
    Usage,
    Peak,
    SwapLimit,
    Procs,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: Version,
    pub root: PathBuf,
}

impl Hierarchy {
    /// This host's memory hierarchy: v1's memory controller if mounted,
    /// else the unified hierarchy if it offers `memory`.
    pub fn detect() -> Option<Hierarchy> {
        let v1 = Hierarchy::at(Version::V1, V1_ROOT);
        if v1.root.join("memory.limit_in_bytes").exists()
            || v1.root.join("memory.usage_in_bytes").exists()
        {
            return Some(v1);
        }
        let v2 = Hierarchy::at(Version::V2, V2_ROOT);
        v2.offers_memory(&v2.root).then_some(v2)
    }

    pub fn at(version: Version, root: impl Into<PathBuf>) -> Hierarchy {
        Hierarchy { version, root: root.into() }
    }

    pub fn name(&self, file: File) -> &'static str {
        match (self.version, file) {
            (Version::V1, File::Limit) => "memory.limit_in_bytes",
            (Version::V1, File::Usage) => "memory.usage_in_bytes",
            (Version::V1, File::Peak) => "memory.max_usage_in_bytes",
            (Version::V1, File::SwapLimit) => "memory.memsw.limit_in_bytes",
            (Version::V2, File::Limit) => "memory.max",
            (Version::V2, File::Usage) => "memory.current",
            (Version::V2, File::Peak) => "memory.peak",
            (Version::V2, File::SwapLimit) => "memory.swap.max",
            (_, File::Procs) => "cgroup.procs",
        }
    }

    /// The cgroup at `rel` under the root.
    pub fn dir(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// A number from one of the cgroup's files; None if absent, unreadable
    /// or `max` (no limit).
    pub fn read_u64(&self, rel: &str, file: File) -> Option<u64> {
        fs::read_to_string(self.dir(rel).join(self.name(file))).ok()?.trim().parse().ok()
    }

    /// Make the cgroup at `rel` (and its parents) with a memory limit of
    /// `limit_bytes`. On v2 each parent from the root down hands `memory`
    /// to its children first.
    pub fn make(&self, rel: &str, limit_bytes: u64) -> Result<PathBuf> {
        let dir = self.dir(rel);
        if self.version == Version::V2 {
            let mut at = self.root.clone();
            for part in Path::new(rel).components() {
                self.hand_down_memory(&at)?;
                at = at.join(part);
                make_dir(&at)?;
            }
        } else {
            make_dir(&dir)?;
        }
        let file = dir.join(self.name(File::Limit));
        fs::write(&file, limit_bytes.to_string())
            .with_context(|| format!("cannot set {} to {limit_bytes}", file.display()))?;
        Ok(dir)
    }

    fn offers_memory(&self, dir: &Path) -> bool {
        let controllers = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        controllers.split_whitespace().any(|c| c == "memory")
    }

    fn hand_down_memory(&self, dir: &Path) -> Result<()> {
        let control = dir.join("cgroup.subtree_control");
        let on = fs::read_to_string(&control).unwrap_or_default();
        if on.split_whitespace().any(|c| c == "memory") {
            return Ok(());
        }
        if !self.offers_memory(dir) {
            bail!(
                "{} has no memory controller to hand down (cgroup.controllers lacks memory)",
                dir.display()
            );
        }
        fs::write(&control, "+memory")
            .with_context(|| format!("cannot enable memory in {}", control.display()))
    }

    pub fn procs(&self, rel: &str) -> Vec<i32> {
        let text = fs::read_to_string(self.dir(rel).join("cgroup.procs")).unwrap_or_default();
        text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    /// Remove the cgroup at `rel`, moving any process still inside to the
    /// root first (rmdir fails while one is there). Gone already is fine.
    pub fn remove(&self, rel: &str) -> Result<()> {
        let dir = self.dir(rel);
        let root_procs = self.root.join("cgroup.procs");
        let deadline = Instant::now() + REMOVE_WAIT;
        loop {
            for pid in self.procs(rel) {
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
}

fn make_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
