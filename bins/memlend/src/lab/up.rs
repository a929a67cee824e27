//! `memlend lab up N`: bridge, namespaces, veths, cgroups, daemons.

use super::names::{self, Subnet};
use super::state::{self, NodeState};
use super::{cgroup, daemon, down, net, UpArgs};
use anyhow::{bail, Context, Result};
use memlend_node::size::human;

pub fn run(a: &UpArgs) -> Result<()> {
    names::check_prefix(&a.prefix)?;
    if a.nodes == 0 || a.nodes > names::NODES_MAX {
        bail!("a lab has 1 to {} nodes, not {}", names::NODES_MAX, a.nodes);
    }
    let subnet = Subnet::parse(&a.subnet)?;
    subnet.node_addr(a.nodes)?;
    if !a.no_daemon {
        daemon::daemon_path()?; // fail before building anything
    }
    if already_up(a)? {
        return Ok(());
    }
    match build(a, &subnet) {
        Ok(()) => Ok(()),
        Err(e) => {
            eprintln!("memlend: lab up failed, removing what it made");
            down::teardown(&a.prefix, true);
            Err(e)
        }
    }
}

/// True when the same lab is already up; an error when a different one (or
/// the remains of one) is in the way.
fn already_up(a: &UpArgs) -> Result<bool> {
    if let Some(nodes) = state::read(&a.prefix) {
        let namespaces = net::lab_namespaces(&a.prefix).len();
        if nodes.len() == a.nodes && namespaces == a.nodes {
            println!("lab {} is already up with {} nodes", a.prefix, a.nodes);
            return Ok(true);
        }
        // A lab of another size, or one half torn down (its state file
        // left, namespaces gone): either way not the lab asked for.
        bail!(
            "lab {} is up with {} nodes ({namespaces} of their namespaces exist), not {}: run \
             `memlend lab down --prefix {}` first",
            a.prefix,
            nodes.len(),
            a.nodes,
            a.prefix
        );
    }
    let leftovers = net::lab_namespaces(&a.prefix).len()
        + net::lab_links(&a.prefix).len()
        + cgroup::lab_cgroups(&a.prefix).len();
    if leftovers > 0 {
        bail!(
            "parts of lab {0} exist already: run `memlend lab down --prefix {0}` first",
            a.prefix
        );
    }
    Ok(false)
}

fn build(a: &UpArgs, subnet: &Subnet) -> Result<()> {
    let dir = names::state_dir(&a.prefix);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    net::make_bridge(&a.prefix)?;
    let mut nodes = Vec::new();
    for i in 1..=a.nodes {
        let name = names::node_name(&a.prefix, i);
        net::make_node(&a.prefix, i, subnet).with_context(|| format!("setting up {name}"))?;
        cgroup::make(&name, a.mem)?;
        nodes.push(NodeState { name, address: subnet.node_addr(i)?.to_string(), pid: None });
    }
    if !a.no_daemon {
        daemon::make_key(&dir)?;
        let broadcast = subnet.broadcast().to_string();
        let mut started = Vec::new();
        for n in &mut nodes {
            let pid = daemon::start(&n.name, &n.address, &broadcast, &dir, &a.daemon_args)?;
            n.pid = Some(pid);
            started.push((n.name.clone(), pid));
        }
        daemon::warn_if_dead(&started);
    }
    state::write(&a.prefix, &a.subnet, a.mem, &nodes)?;
    print_summary(a, subnet, &nodes);
    Ok(())
}

fn print_summary(a: &UpArgs, subnet: &Subnet, nodes: &[NodeState]) {
    println!(
        "lab {}: {} nodes on bridge {}, broadcast {}, {} of memory each",
        a.prefix,
        nodes.len(),
        names::bridge(&a.prefix),
        subnet.broadcast(),
        human(a.mem)
    );
    for n in nodes {
        let daemon = n.pid.map(|p| format!("memlendd pid {p}")).unwrap_or("no daemon".into());
        println!("  {:<10} {:<15} {daemon}", n.name, n.address);
    }
}
