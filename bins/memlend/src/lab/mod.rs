//! `memlend lab`: a cluster on one machine. Each node is a network
//! namespace on a shared bridge with its own memory cgroup limit (v1 or v2)
//! and, unless told otherwise, its own memlendd. See docs/lab.md.

mod cgroup;
mod daemon;
pub mod delayer;
mod down;
mod names;
mod net;
mod netem;
pub mod procs;
pub mod state;
mod status;
mod up;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use memlend_node::size::parse_size;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

pub use names::prefix_of;

#[derive(Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    cmd: LabCmd,
}

#[derive(Subcommand, Debug)]
enum LabCmd {
    /// Make N nodes: namespaces <prefix>-n1..nN on bridge <prefix>br0, each
    /// with a memory cgroup and (unless --no-daemon) a memlendd.
    Up(UpArgs),
    /// Remove everything a lab made: daemons, balloons, namespaces, links,
    /// cgroups, state files. Nothing to remove is fine.
    Down(PrefixArgs),
    /// Run a command in a node's namespace and cgroup; exits with its status.
    Exec {
        /// The node, e.g. ml-n1.
        node: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Nodes, addresses, daemons, balloons, and cgroup memory use.
    Status(PrefixArgs),
    /// Delay and drop packets arriving at nodes, as tc netem would (this
    /// kernel has none): an NFQUEUE holder in each node. `--clear` undoes.
    Netem(netem::NetemArgs),
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// How many nodes.
    nodes: usize,
    /// Memory limit of each node's cgroup.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    mem: u64,
    /// Names: bridge <prefix>br0, nodes <prefix>-n1.. (1-10 of a-z, 0-9).
    #[arg(long, default_value = names::DEFAULT_PREFIX)]
    prefix: String,
    /// Node i gets host address 10+i in this subnet.
    #[arg(long, default_value = "10.77.0.0/24")]
    subnet: String,
    /// Do not start memlendd in the nodes.
    #[arg(long)]
    no_daemon: bool,
    /// An extra argument for every memlendd (repeat for more).
    #[arg(long = "daemon-arg", value_name = "ARG", allow_hyphen_values = true)]
    daemon_args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct PrefixArgs {
    /// The lab's prefix, as given to `lab up`.
    #[arg(long, default_value = names::DEFAULT_PREFIX)]
    prefix: String,
}

pub fn run(a: &LabArgs) -> Result<()> {
    match &a.cmd {
        LabCmd::Up(u) => up::run(u),
        LabCmd::Down(p) => down::run(&p.prefix),
        LabCmd::Status(p) => status::run(&p.prefix),
        LabCmd::Exec { node, cmd } => exec(node, cmd),
        LabCmd::Netem(n) => netem::run(n),
    }
}

/// Run CMD in the node and exit with its status (128+N when killed by N).
fn exec(node: &str, cmd: &[String]) -> Result<()> {
    prefix_of(node)?;
    let mut command = Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    procs::in_node(&mut command, node)?;
    let status = command.status().with_context(|| format!("cannot run {}", cmd[0]))?;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    std::process::exit(code);
}
