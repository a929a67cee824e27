//! `memlend lab status`: nodes, addresses, daemons, cgroup memory.

use super::state::{self, NodeState};
use super::{cgroup, names, net, procs};
use anyhow::Result;
use memlend_host::cgroup::File;
use memlend_node::size::human;

pub fn run(prefix: &str) -> Result<()> {
    names::check_prefix(prefix)?;
    let nodes = match state::read(prefix) {
        Some(nodes) => nodes,
        None => discovered(prefix),
    };
    if nodes.is_empty() {
        println!("lab {prefix} is not up");
        return Ok(());
    }
    println!("lab {prefix}: {} nodes, bridge {}", nodes.len(), names::bridge(prefix));
    println!(
        "  {:<10} {:<15} {:<22} {:<12} memory used / limit",
        "node", "address", "daemon", "balloon"
    );
    for n in &nodes {
        println!(
            "  {:<10} {:<15} {:<22} {:<12} {}",
            n.name,
            n.address,
            daemon(n),
            balloon(&n.name),
            memory(&n.name)
        );
    }
    Ok(())
}

/// Without lab.json, show what exists by name (addresses unknown).
fn discovered(prefix: &str) -> Vec<NodeState> {
    let nodes = net::lab_namespaces(prefix);
    nodes.into_iter().map(|name| NodeState { name, address: "?".into(), pid: None }).collect()
}

fn daemon(n: &NodeState) -> String {
    match n.pid {
        Some(pid) if procs::alive(pid) && procs::runs(pid, "memlendd") => {
            format!("alive (pid {pid})")
        }
        Some(pid) => format!("dead (was pid {pid})"),
        None => "none".into(),
    }
}

fn balloon(node: &str) -> String {
    let pid = state::balloon_pid_file(node).ok().and_then(|f| procs::read_pid(&f, "balloon-hold"));
    pid.map(|p| format!("pid {p}")).unwrap_or("none".into())
}

fn memory(node: &str) -> String {
    let used = cgroup::read_u64(node, File::Usage);
    let limit = cgroup::read_u64(node, File::Limit);
    match (used, limit) {
        (Some(u), Some(l)) => format!("{} / {}", human(u), human(l)),
        _ => "no cgroup".into(),
    }
}
