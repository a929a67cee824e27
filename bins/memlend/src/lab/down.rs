//! `memlend lab down`: everything a lab made, found by its prefix (lab.json
//! is not needed), removed in an order that lets each step succeed:
//! processes, then namespaces and links, then cgroups, then state files.

use super::{cgroup, names, net, procs};
use anyhow::{bail, Result};
use std::collections::BTreeSet;
use std::path::Path;

pub fn run(prefix: &str) -> Result<()> {
    names::check_prefix(prefix)?;
    let (removed, problems) = teardown(prefix, false);
    if !problems.is_empty() {
        bail!("lab {prefix} is not fully down:\n  {}", problems.join("\n  "));
    }
    if removed == 0 {
        println!("lab {prefix}: nothing to remove");
    } else {
        println!("lab {prefix} is down ({removed} things removed)");
    }
    Ok(())
}

/// Remove what exists of lab `prefix`; returns how many things were removed
/// and what could not be. `quiet` drops the per-step messages.
pub fn teardown(prefix: &str, quiet: bool) -> (usize, Vec<String>) {
    let mut problems = Vec::new();
    let namespaces = net::lab_namespaces(prefix);
    let cgroups = cgroup::lab_cgroups(prefix);
    let dir = names::state_dir(prefix);

    let pids = lab_pids(prefix, &namespaces, &cgroups, &dir);
    if !pids.is_empty() && !quiet {
        println!("stopping {} processes", pids.len());
    }
    for pid in procs::stop(&pids) {
        problems.push(format!("process {pid} survived SIGKILL"));
    }
    let links = net::lab_links(prefix);
    let removed = namespaces.len() + links.len() + cgroups.len() + usize::from(dir.exists());
    for ns in &namespaces {
        if let Err(e) = net::delete_namespace(ns) {
            problems.push(format!("{e:#}"));
        }
    }
    for link in &links {
        if let Err(e) = net::delete_link(link) {
            problems.push(format!("{e:#}"));
        }
    }
    for cg in &cgroups {
        if let Err(e) = cgroup::remove(cg) {
            problems.push(format!("{e:#}"));
        }
    }
    cgroup::remove_parent_if_empty();
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            problems.push(format!("cannot remove {}: {e}", dir.display()));
        }
    }
    (removed, problems)
}

/// Every process of the lab: daemons and balloons from pid files (checked
/// to be ours), and whatever else sits in a node's cgroup or namespace.
fn lab_pids(prefix: &str, namespaces: &[String], cgroups: &[String], dir: &Path) -> Vec<i32> {
    let mut pids = BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let what = match () {
                _ if name.ends_with(".balloon.pid") => "balloon-hold",
                _ if name.ends_with(".netem.pid") => "netem-hold",
                _ => "memlendd",
            };
            if name.starts_with(prefix) && name.ends_with(".pid") {
                pids.extend(procs::read_pid(&entry.path(), what));
            }
        }
    }
    for cg in cgroups {
        pids.extend(cgroup::procs(cg));
    }
    for ns in namespaces {
        pids.extend(net::namespace_pids(ns));
    }
    let me = std::process::id() as i32;
    pids.into_iter().filter(|&p| p != me).collect()
}
