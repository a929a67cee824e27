//! `memlend lab down`: everything a lab made, found by its prefix (lab.json
//! is not needed), removed in an order that lets each step succeed:
//! processes, then namespaces and links, then cgroups, then state files.

use super::{cgroup, names, net, procs};
use anyhow::{bail, Context, Result};
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
    let mut note = |step: Result<()>| problems.extend(step.err().map(|e| format!("{e:#}")));
    namespaces.iter().for_each(|ns| note(remove_namespace(ns)));
    links.iter().for_each(|link| note(remove_link(link)));
    cgroups.iter().for_each(|cg| note(remove_cgroup(cg)));
    cgroup::remove_parent_if_empty();
    note(remove_state(&dir));
    (removed, problems)
}

fn remove_namespace(ns: &str) -> Result<()> {
    unless_gone(net::delete_namespace(ns), || net::namespace_exists(ns))
}

fn remove_link(link: &str) -> Result<()> {
    unless_gone(net::delete_link(link), || net::link_exists(link))
}

fn remove_cgroup(cg: &str) -> Result<()> {
    unless_gone(cgroup::remove(cg), || super::cgroup::dir(cg).exists())
}

fn remove_state(dir: &Path) -> Result<()> {
    let step = std::fs::remove_dir_all(dir);
    unless_gone(step.with_context(|| format!("cannot remove {}", dir.display())), || dir.exists())
}

/// A step that failed on something no longer there lost a race, not its
/// aim: a veth goes by itself once its peer's namespace is deleted, and
/// the kernel does that a moment later. Any other failure stands.
fn unless_gone(step: Result<()>, still_there: impl FnOnce() -> bool) -> Result<()> {
    match step {
        Err(_) if !still_there() => Ok(()),
        other => other,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn a_failure_on_something_gone_is_not_a_problem_and_any_other_is() {
        assert!(unless_gone(Ok(()), || true).is_ok());
        assert!(unless_gone(Err(anyhow!("Cannot find device")), || false).is_ok());
        let err = unless_gone(Err(anyhow!("Operation not permitted")), || true).unwrap_err();
        assert_eq!(err.to_string(), "Operation not permitted");
    }

    /// What `lab down` met in the race, made certain: each kind of thing
    /// deleted when it is not there (`ip` fails on the link and namespace).
    #[test]
    fn removing_what_is_already_gone_succeeds() {
        if std::process::Command::new("ip").arg("-V").output().is_err() {
            return memlend_testskip::skip("no `ip` (iproute2)");
        }
        remove_link("tgone-v9").unwrap();
        remove_namespace("tgone-n9").unwrap();
        remove_cgroup("tgone-n9").unwrap();
        remove_state(Path::new("/run/memlend-lab-tgone")).unwrap();
    }
}
