//! `memlend status`: the cluster as the local memlendd sees it (each node's
//! class and memory, the leases, handshake latency), or, with --donor, one
//! donor's budget over the page protocol.

use anyhow::{Context, Result};
use clap::Args;
use memlend_node::size::human;
use memlend_pool::api::{Ask, Client, ClusterStatus, LeaseView, NodeView, Tell};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Ask one donor over the page protocol instead of the local daemon.
    #[arg(long)]
    pub donor: Option<SocketAddr>,
    /// The cluster key file (with --donor).
    #[arg(long, conflicts_with = "insecure")]
    pub key: Option<PathBuf>,
    /// Talk to a donor that runs without a key (with --donor).
    #[arg(long)]
    pub insecure: bool,
    /// The daemon's API socket (default $MEMLEND_POOL or
    /// /run/memlend/memlendd.sock).
    #[arg(long, conflicts_with = "node")]
    pub api: Option<PathBuf>,
    /// A node of a lab on this machine (`memlend lab up`), by name: ask its
    /// daemon, whose socket is in the lab's state directory.
    #[arg(long)]
    pub node: Option<String>,
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &StatusArgs) -> Result<()> {
    if let Some(donor) = a.donor {
        let d = crate::donor::DonorArgs { donor, key: a.key.clone(), insecure: a.insecure };
        return crate::donor::status(&d);
    }
    let path = api_path(a.api.as_ref(), a.node.as_ref())?;
    let st = match fetch(&path) {
        Ok(st) => st,
        Err(e) if a.api.is_none() && a.node.is_none() => match lab_sockets().as_slice() {
            [] => return Err(e),
            socks => {
                let nodes: Vec<String> = socks.iter().map(|(n, _)| n.clone()).collect();
                anyhow::bail!(
                    "{e:#}\nA lab is up on this machine; ask one of its nodes: \
                     memlend status --node {} (nodes: {})",
                    nodes[0],
                    nodes.join(", ")
                )
            }
        },
        Err(e) => return Err(e),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    print(&st);
    Ok(())
}

/// The daemon's API socket: the one given, a lab node's, or the default.
pub fn api_path(api: Option<&PathBuf>, node: Option<&String>) -> Result<PathBuf> {
    Ok(match (api, node) {
        (Some(api), _) => api.clone(),
        (None, Some(node)) => lab_socket(node)?,
        (None, None) => memlend_borrow::open::cluster::default_api_path(),
    })
}

/// The API sockets of lab nodes on this machine, as (node, socket), sorted:
/// `<node>.sock` in each lab's state directory (/run/memlend-lab*).
fn lab_sockets() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let Ok(run) = std::fs::read_dir("/run") else { return found };
    for dir in run.flatten().filter(|d| d.file_name().to_string_lossy().starts_with("memlend-lab"))
    {
        let Ok(entries) = std::fs::read_dir(dir.path()) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "sock") {
                let node = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
                found.push((node, path));
            }
        }
    }
    found.sort();
    found
}

fn lab_socket(node: &str) -> Result<PathBuf> {
    let socks = lab_sockets();
    match socks.iter().find(|(n, _)| n == node) {
        Some((_, path)) => Ok(path.clone()),
        None if socks.is_empty() => {
            anyhow::bail!("no lab is up on this machine (memlend lab up N)")
        }
        None => {
            let nodes: Vec<&str> = socks.iter().map(|(n, _)| n.as_str()).collect();
            anyhow::bail!("no lab node {node:?}; the labs here have {}", nodes.join(", "))
        }
    }
}

pub fn fetch(path: &std::path::Path) -> Result<ClusterStatus> {
    let mut c = Client::connect(path)?;
    c.ask(&Ask::Status)?;
    for _ in 0..16 {
        match c.next(Some(Duration::from_secs(5))).context("memlendd did not answer")? {
            Some(Tell::Status(s)) => return Ok(*s),
            Some(_) => continue,
            None => break,
        }
    }
    anyhow::bail!("memlendd closed the connection without a status")
}

fn print(st: &ClusterStatus) {
    println!(
        "{:<12} {:<8} {:>10} {:>10} {:>10} {:>10}",
        "NODE", "CLASS", "TOTAL", "USED", "LENT", "BORROWED"
    );
    let row = |n: &NodeView, note: &str| {
        println!(
            "{:<12} {:<8} {:>10} {:>10} {:>10} {:>10}  {note}",
            n.name,
            n.class,
            human(n.total_bytes),
            human(n.used_bytes),
            human(n.lent_bytes),
            human(n.borrowed_bytes)
        );
    };
    row(&st.node, "(this node)");
    for p in &st.peers {
        row(p, if p.alive { "" } else { "(suspect)" });
    }
    let name = |id: u64| {
        st.peers.iter().find(|p| p.id == id).map_or(format!("{id:016x}"), |p| p.name.clone())
    };
    let leases = |title: &str, v: &[LeaseView], role: &str| {
        if v.is_empty() {
            return;
        }
        println!("\n{title}:");
        for l in v {
            println!(
                "  lease {:<6} {role} {:<12} {:>10}  {:<10} {} pages/s",
                l.lease,
                name(l.peer),
                human(l.bytes),
                l.state,
                l.pages_per_s
            );
        }
    };
    leases("lent", &st.lent, "to");
    leases("borrowed", &st.borrowed, "from");
    if st.unmet_bytes > 0 {
        println!("\nwanted and not yet granted: {}", human(st.unmet_bytes));
    }
    if let (Some(p50), Some(p99)) = (st.handshake_us_p50, st.handshake_us_p99) {
        println!(
            "\nhandshakes: {} (request to confirmed lease: p50 {p50} µs, p99 {p99} µs)",
            st.handshakes
        );
    }
}
