//! What this process's memory cgroup charges, for `memlend run --mem`
//! inside a cgroup whose limit is the one that binds: the limit the kernel
//! enforces, and the charge against it that reclaim cannot simply drop
//! (usage less inactive page cache). Either hierarchy.

use crate::meminfo::cgroup_dirs;
use std::fs;
use std::path::{Path, PathBuf};

/// A v1 limit at or above this reads as "no limit" (v1 writes
/// 9223372036854771712 for it; v2 writes `max`).
const UNLIMITED_BYTES: u64 = 1 << 60;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    dir: PathBuf,
    v2: bool,
}

impl Charge {
    /// This process's memory cgroup, if it has one (v1's memory controller
    /// or v2's unified hierarchy with `memory` on).
    pub fn of_self() -> Option<Charge> {
        let text = fs::read_to_string("/proc/self/cgroup").ok()?;
        Charge::first_of(cgroup_dirs(&text))
    }

    fn first_of(dirs: Vec<PathBuf>) -> Option<Charge> {
        dirs.into_iter().find_map(|dir| {
            if dir.join("memory.limit_in_bytes").exists() {
                Some(Charge { dir, v2: false })
            } else if dir.join("memory.max").exists() {
                Some(Charge { dir, v2: true })
            } else {
                None
            }
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit the kernel holds the cgroup to; None without one. On v2
    /// `memory.high` counts too: above it the kernel throttles the cgroup.
    pub fn limit_bytes(&self) -> Option<u64> {
        let file = |name: &str| read_u64(&self.dir.join(name)).filter(|&b| b < UNLIMITED_BYTES);
        if self.v2 {
            match (file("memory.max"), file("memory.high")) {
                (Some(max), Some(high)) => Some(max.min(high)),
                (max, high) => max.or(high),
            }
        } else {
            file("memory.limit_in_bytes")
        }
    }

    /// What the cgroup is charged that reclaim should not have to drop: its
    /// usage less its inactive page cache beyond `file_counted_bytes` (the
    /// first of it is counted all the same: a program's cold code pages,
    /// dropped, are read again). None if unreadable.
    pub fn charged_bytes(&self, file_counted_bytes: u64) -> Option<u64> {
        let (usage, stat) = self.usage_and_stat()?;
        let inactive = inactive_file_bytes(&stat, self.v2);
        Some(usage.saturating_sub(inactive.saturating_sub(file_counted_bytes)))
    }

    /// `charged_bytes`, with the dirty pages and those under writeback
    /// counted too: the kernel cannot drop them at once. For a consumer
    /// that writes through the page cache as fast as it fills memory (the
    /// shared-memory server over an `--ssd` file), whose inactive pages
    /// are mostly dirty.
    pub fn charged_bytes_counting_dirty(&self, file_counted_bytes: u64) -> Option<u64> {
        let (usage, stat) = self.usage_and_stat()?;
        let clean_inactive =
            inactive_file_bytes(&stat, self.v2).saturating_sub(dirty_file_bytes(&stat, self.v2));
        Some(usage.saturating_sub(clean_inactive.saturating_sub(file_counted_bytes)))
    }

    /// The cgroup's usage and the text of its memory.stat.
    fn usage_and_stat(&self) -> Option<(u64, String)> {
        let usage_file = if self.v2 { "memory.current" } else { "memory.usage_in_bytes" };
        let usage = read_u64(&self.dir.join(usage_file))?;
        Some((usage, fs::read_to_string(self.dir.join("memory.stat")).ok()?))
    }

    /// How many processes the cgroup holds (at least 1: this one).
    pub fn procs(&self) -> usize {
        let text = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        text.lines().filter(|l| !l.trim().is_empty()).count().max(1)
    }
}

/// The inactive page cache in the text of `memory.stat`: v1's
/// hierarchical `total_inactive_file` where present, else `inactive_file`.
pub fn inactive_file_bytes(stat: &str, v2: bool) -> u64 {
    let hierarchical = if v2 { None } else { stat_field(stat, "total_inactive_file") };
    hierarchical.or_else(|| stat_field(stat, "inactive_file")).unwrap_or(0)
}

/// The page cache that is dirty or under writeback, from `memory.stat`
/// (v1's hierarchical `total_` fields where present; v2 names them
/// `file_dirty` and `file_writeback`).
pub fn dirty_file_bytes(stat: &str, v2: bool) -> u64 {
    let field = |name: &str| {
        let hierarchical = if v2 { None } else { stat_field(stat, &format!("total_{name}")) };
        hierarchical.or_else(|| stat_field(stat, name)).unwrap_or(0)
    };
    let (dirty, writeback) =
        if v2 { ("file_dirty", "file_writeback") } else { ("dirty", "writeback") };
    field(dirty) + field(writeback)
}

/// A `name value` line of a cgroup's memory.stat; 0 if absent.
pub fn parse_stat_field(stat: &str, name: &str) -> u64 {
    stat_field(stat, name).unwrap_or(0)
}

fn stat_field(stat: &str, name: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_file_is_read_from_either_layout() {
        let v1 = "dirty 1\ntotal_dirty 15\ntotal_writeback 5\n";
        assert_eq!(dirty_file_bytes(v1, false), 20);
        assert_eq!(dirty_file_bytes("file_dirty 15\nfile_writeback 5\n", true), 20);
        assert_eq!(dirty_file_bytes("garbage\n", false), 0);
    }

    #[test]
    fn inactive_file_is_read_from_either_layout() {
        let v1 = "cache 100\ninactive_file 40\ntotal_cache 300\ntotal_inactive_file 120\n";
        assert_eq!(inactive_file_bytes(v1, false), 120);
        assert_eq!(inactive_file_bytes("inactive_file 40\n", false), 40);
        let v2 = "anon 9\nfile 50\ninactive_file 30\nactive_file 20\n";
        assert_eq!(inactive_file_bytes(v2, true), 30);
        assert_eq!(inactive_file_bytes("garbage\n", true), 0);
    }

    #[test]
    fn limits_read_from_a_cgroup_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let w = |name: &str, text: &str| std::fs::write(tmp.path().join(name), text).unwrap();
        w("memory.max", "max\n");
        w("memory.high", "max\n");
        w("memory.current", "5000\n");
        w("memory.stat", "inactive_file 1000\n");
        w("cgroup.procs", "12\n34\n");
        let cg = Charge::first_of(vec![tmp.path().to_path_buf()]).unwrap();
        assert_eq!(cg.limit_bytes(), None);
        assert_eq!(cg.charged_bytes(0), Some(4000));
        assert_eq!(cg.charged_bytes(600), Some(4600));
        assert_eq!(cg.charged_bytes(2000), Some(5000));
        assert_eq!(cg.procs(), 2);
        w("memory.high", "3000\n");
        w("memory.max", "8000\n");
        assert_eq!(cg.limit_bytes(), Some(3000));

        let v1 = tempfile::tempdir().unwrap();
        std::fs::write(v1.path().join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let cg = Charge::first_of(vec![v1.path().to_path_buf()]).unwrap();
        assert_eq!(cg.limit_bytes(), None, "v1's largest limit reads as none");
        std::fs::write(v1.path().join("memory.limit_in_bytes"), "134217728\n").unwrap();
        assert_eq!(cg.limit_bytes(), Some(128 << 20));
    }
}
