//! The network: a bridge in the root namespace and one namespace per node,
//! joined by veth pairs. Everything is done by running `ip` (iproute2).

use super::names::{self, Subnet};
use anyhow::{bail, Context, Result};
use std::process::Command;

/// Run `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip`: install iproute2 (scripts/setup.sh does)")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("ip {} failed: {}", args.join(" "), err.trim());
    }
    Ok(())
}

/// `ip ARGS`'s stdout, or empty when it fails (used only for discovery).
fn ip_output(args: &[&str]) -> String {
    match Command::new("ip").args(args).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => String::new(),
    }
}

pub fn make_bridge(prefix: &str) -> Result<()> {
    let br = names::bridge(prefix);
    ip(&["link", "add", &br, "type", "bridge"])?;
    ip(&["link", "set", &br, "up"])
}

/// Namespace, veth pair on the bridge, eth0 with its address and a
/// broadcast address (`brd +`), and lo, all up.
pub fn make_node(prefix: &str, i: usize, subnet: &Subnet) -> Result<()> {
    let (ns, host, peer) =
        (names::node_name(prefix, i), names::veth_host(prefix, i), names::veth_peer(prefix, i));
    let addr = format!("{}/{}", subnet.node_addr(i)?, subnet.len);
    ip(&["netns", "add", &ns])?;
    ip(&["link", "add", &host, "type", "veth", "peer", "name", &peer])?;
    ip(&["link", "set", &host, "master", &names::bridge(prefix), "up"])?;
    ip(&["link", "set", &peer, "netns", &ns])?;
    ip(&["-n", &ns, "link", "set", &peer, "name", "eth0"])?;
    ip(&["-n", &ns, "addr", "add", &addr, "brd", "+", "dev", "eth0"])?;
    ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
    ip(&["-n", &ns, "link", "set", "lo", "up"])
}

/// Namespaces named `<prefix>-n<i>`.
pub fn lab_namespaces(prefix: &str) -> Vec<String> {
    let listing = ip_output(&["netns", "list"]);
    let names = listing.lines().filter_map(|l| l.split_whitespace().next());
    names.filter(|n| names::is_indexed(n, prefix, "-n")).map(str::to_string).collect()
}

/// Root-namespace links of the lab: its bridge and the veth ends on it.
pub fn lab_links(prefix: &str) -> Vec<String> {
    let listing = ip_output(&["-o", "link", "show"]);
    let bridge = names::bridge(prefix);
    let mut found = Vec::new();
    for line in listing.lines() {
        // "7: ml-v1@if6: <BROADCAST,..." -> "ml-v1"
        let Some(name) = line.split(": ").nth(1) else { continue };
        let name = name.split('@').next().unwrap_or(name);
        let ours = name == bridge
            || names::is_indexed(name, prefix, "-v")
            || names::is_indexed(name, prefix, "-p");
        if ours {
            found.push(name.to_string());
        }
    }
    found
}

/// Pids of every process inside a namespace.
pub fn namespace_pids(ns: &str) -> Vec<i32> {
    ip_output(&["netns", "pids", ns]).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

pub fn delete_namespace(ns: &str) -> Result<()> {
    ip(&["netns", "delete", ns])
}

/// Whether the namespace's file (what `ip netns` names it by) is there.
pub fn namespace_exists(ns: &str) -> bool {
    std::path::Path::new("/var/run/netns").join(ns).exists()
}

/// Deleting one end of a veth pair deletes both.
pub fn delete_link(name: &str) -> Result<()> {
    ip(&["link", "delete", name])
}

/// Whether a root-namespace link is there; true when `ip` cannot tell, so
/// that a failure to delete it is not mistaken for its being gone.
pub fn link_exists(name: &str) -> bool {
    Command::new("ip").args(["link", "show", name]).output().map_or(true, |o| o.status.success())
}
