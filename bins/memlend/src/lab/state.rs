//! lab.json: what `lab up` made, for `status` and for people. `down` does
//! not depend on it (it discovers by prefix), so a lost file loses nothing.

use super::names;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;

pub struct NodeState {
    pub name: String,
    pub address: String,
    pub pid: Option<i32>,
}

pub fn file(prefix: &str) -> PathBuf {
    names::state_dir(prefix).join("lab.json")
}

pub fn write(prefix: &str, subnet: &str, mem: u64, nodes: &[NodeState]) -> Result<()> {
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "name": n.name,
                "netns": n.name,
                "address": n.address,
                "cgroup": super::cgroup::dir(&n.name),
                "pid": n.pid,
            })
        })
        .collect();
    let doc = json!({
        "prefix": prefix,
        "bridge": names::bridge(prefix),
        "subnet": subnet,
        "mem_bytes": mem,
        "nodes": nodes,
    });
    let path = file(prefix);
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The nodes in lab.json, or None when there is no readable file.
pub fn read(prefix: &str) -> Option<Vec<NodeState>> {
    let text = std::fs::read_to_string(file(prefix)).ok()?;
    let doc: Value = serde_json::from_str(&text).ok()?;
    let nodes = doc.get("nodes")?.as_array()?;
    let node = |v: &Value| NodeState {
        name: v["name"].as_str().unwrap_or_default().to_string(),
        address: v["address"].as_str().unwrap_or_default().to_string(),
        pid: v["pid"].as_i64().map(|p| p as i32),
    };
    Some(nodes.iter().map(node).collect())
}

pub fn pid_file(node: &str) -> Result<PathBuf> {
    Ok(names::state_dir(&names::prefix_of(node)?).join(format!("{node}.pid")))
}

pub fn log_file(node: &str) -> Result<PathBuf> {
    Ok(names::state_dir(&names::prefix_of(node)?).join(format!("{node}.log")))
}

pub fn balloon_pid_file(node: &str) -> Result<PathBuf> {
    Ok(names::state_dir(&names::prefix_of(node)?).join(format!("{node}.balloon.pid")))
}
