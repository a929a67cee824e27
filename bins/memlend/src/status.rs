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
    #[arg(long)]
    pub api: Option<PathBuf>,
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &StatusArgs) -> Result<()> {
    if let Some(donor) = a.donor {
        let d = crate::donor::DonorArgs { donor, key: a.key.clone(), insecure: a.insecure };
        return crate::donor::status(&d);
    }
    let path = a.api.clone().unwrap_or_else(memlend_place::pool::default_api_path);
    let st = fetch(&path)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    print(&st);
    Ok(())
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
