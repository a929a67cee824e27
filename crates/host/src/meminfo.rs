//! How much memory this node can really lend: the kernel's MemAvailable,
//! and the room left under this process's cgroup limit, whichever is less.

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// Memory a daemon keeps back for itself and the host: lending the last
/// free page would make the donor the one that swaps.
pub fn headroom_bytes(total_bytes: u64) -> u64 {
    (total_bytes / 20).min(512 << 20)
}

/// What the node has, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    pub total_bytes: u64,
    pub available_bytes: u64,
    /// Room under the cgroup limit, when one applies.
    pub cgroup_room_bytes: Option<u64>,
}

impl Memory {
    pub fn read() -> Result<Self> {
        let text = fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo")?;
        let (total_bytes, available_bytes) =
            parse_meminfo(&text).map_err(|what| anyhow::anyhow!("/proc/meminfo: {what}"))?;
        Ok(Memory { total_bytes, available_bytes, cgroup_room_bytes: cgroup_room() })
    }

    /// The most this node can lend now.
    pub fn lendable_bytes(&self) -> u64 {
        let room = self.cgroup_room_bytes.unwrap_or(u64::MAX).min(self.available_bytes);
        room.saturating_sub(headroom_bytes(self.total_bytes))
    }
}

/// MemTotal and MemAvailable, in bytes, from the text of /proc/meminfo.
pub fn parse_meminfo(text: &str) -> std::result::Result<(u64, u64), String> {
    let field = |name: &str| -> std::result::Result<u64, String> {
        let line = text.lines().find(|l| l.starts_with(name)).ok_or(format!("no {name}"))?;
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("bad line {line:?}"))?;
        Ok(kib * 1024)
    };
    Ok((field("MemTotal:")?, field("MemAvailable:")?))
}

/// Memory cgroup directories named in the text of /proc/self/cgroup: v1's
/// under /sys/fs/cgroup/memory, v2's under /sys/fs/cgroup.
pub fn cgroup_dirs(text: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctl.split(',').any(|c| c == "memory") {
            dirs.push(PathBuf::from(format!("/sys/fs/cgroup/memory{path}")));
        } else if ctl.is_empty() {
            dirs.push(PathBuf::from(format!("/sys/fs/cgroup{path}")));
        }
    }
    dirs
}

/// Room under the memory limit of this process's cgroup (v1 or v2).
fn cgroup_room() -> Option<u64> {
    let cg = fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_dirs(&cg).into_iter().find_map(|dir| {
        let file = |name: &str| read_u64(&dir.join(name));
        let (limit, usage) = match file("memory.limit_in_bytes") {
            Some(limit) => (limit, file("memory.usage_in_bytes")?),
            None => (file("memory.max")?, file("memory.current")?),
        };
        Some(limit.saturating_sub(usage))
    })
}

/// A number from a cgroup file; `max` (no limit) reads as None.
fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Refuse to lend more than the node can give, with the numbers that say why.
pub fn check_lend(lend_bytes: u64, mem: &Memory) -> Result<()> {
    let can = mem.lendable_bytes();
    if lend_bytes > can {
        let h = memlend_node::size::human;
        let cgroup =
            mem.cgroup_room_bytes.map_or(String::new(), |r| format!(", cgroup room {}", h(r)));
        bail!(
            "cannot lend {}: this node can lend at most {} (MemAvailable {}{cgroup}, less {} kept back)",
            h(lend_bytes),
            h(can),
            h(mem.available_bytes),
            h(headroom_bytes(mem.total_bytes)),
        );
    }
    Ok(())
}

/// With `--mlock`, the whole lend must fit under RLIMIT_MEMLOCK.
pub fn check_mlock(lend_bytes: u64) -> Result<()> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct that we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        bail!("getrlimit(RLIMIT_MEMLOCK): {}", std::io::Error::last_os_error());
    }
    if rl.rlim_cur != libc::RLIM_INFINITY && lend_bytes > rl.rlim_cur {
        bail!(
            "--mlock needs {} locked, but RLIMIT_MEMLOCK is {} (ulimit -l, or run as root)",
            memlend_node::size::human(lend_bytes),
            memlend_node::size::human(rl.rlim_cur)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_available() {
        let mem =
            Memory { total_bytes: 8 << 30, available_bytes: 4 << 30, cgroup_room_bytes: None };
        assert!(check_lend(3 << 30, &mem).is_ok());
        let err = check_lend(4 << 30, &mem).unwrap_err().to_string();
        assert!(err.contains("can lend at most"), "{err}");
        let tight = Memory { cgroup_room_bytes: Some(1 << 30), ..mem };
        assert!(check_lend(2 << 30, &tight).is_err());
        assert!(Memory::read().unwrap().lendable_bytes() > 0);
    }
}
