//! memlendd in a node. The daemon's lab flags are still settling: change
//! the command line here, in `daemon_args`, and nowhere else.

use super::{procs, state};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The daemon's arguments for one node; `lab up --daemon-arg` values are
/// appended after these. Every node joins the lab's cluster by broadcast on
/// its bridge, with the lab's key; its API socket and timeline sit in the
/// lab's state directory (unix sockets are not per namespace).
pub fn daemon_args(node: &str, addr: &str, broadcast: &str, dir: &Path) -> Vec<String> {
    let at = |name: &str| dir.join(name).display().to_string();
    [
        "--cluster",
        "--node",
        node,
        "--listen",
        &format!("{addr}:7070"),
        "--broadcast",
        &format!("{broadcast}:7071"),
        "--key",
        &at("key"),
        "--api",
        &at(&format!("{node}.sock")),
        "--timeline",
        &at(&format!("{node}.timeline")),
        "--memory",
        &super::cgroup::dir(node).display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The lab's cluster key, made once per lab (mode 0600).
pub fn make_key(dir: &Path) -> Result<()> {
    let path = dir.join("key");
    if !path.exists() {
        memlend_node::keyfile::generate(&path)?;
    }
    Ok(())
}

/// memlendd sits next to the memlend binary (same cargo target dir or
/// install dir).
pub fn daemon_path() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the memlend binary")?;
    let path = exe.with_file_name("memlendd");
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it (cargo build --release)",
        path.display()
    );
    Ok(path)
}

/// Start memlendd detached inside the node; writes its pid file and returns
/// the pid.
pub fn start(node: &str, addr: &str, broadcast: &str, dir: &Path, extra: &[String]) -> Result<i32> {
    let mut cmd = Command::new(daemon_path()?);
    cmd.args(daemon_args(node, addr, broadcast, dir)).args(extra);
    procs::in_node(&mut cmd, node)?;
    procs::detach(&mut cmd, &state::log_file(node)?)?;
    let child = cmd.spawn().with_context(|| format!("cannot start memlendd on {node}"))?;
    let pid = child.id() as i32;
    std::fs::write(state::pid_file(node)?, format!("{pid}\n"))?;
    Ok(pid)
}

/// A daemon that dies at once (bad flags, port taken) shows within a moment;
/// report it without failing `up`, since the network and cgroups are still
/// useful and the log says why.
pub fn warn_if_dead(nodes: &[(String, i32)]) {
    std::thread::sleep(Duration::from_millis(500));
    for (node, pid) in nodes {
        if !procs::alive(*pid) {
            let log = state::log_file(node).map(|p| p.display().to_string()).unwrap_or_default();
            eprintln!("memlend: warning: memlendd on {node} (pid {pid}) exited at once; see {log}");
        }
    }
}
