use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

/// memlendd: lend this node's idle RAM to other nodes.
#[derive(Parser, Debug)]
#[command(version, about)]
pub struct Args {
    /// How much memory to lend in all, e.g. `2G`. Refused if the node cannot
    /// really give it.
    #[arg(long, value_parser = memlend_node::size::parse_pages, value_name = "SIZE")]
    pub lend: u64,

    /// Address for the page protocol (borrowers).
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Also serve NBD exports on this address (keep it on loopback or a
    /// trusted network: NBD has no authentication here).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<SocketAddr>,

    /// An NBD export `NAME=SIZE`, carved out of --lend; repeatable. The first
    /// one is also served for the empty name. Default with --nbd: one export
    /// `memlend` of the whole --lend.
    #[arg(long = "export", value_name = "NAME=SIZE", value_parser = parse_export)]
    pub exports: Vec<(String, u64)>,

    /// The cluster key file (make one with `memlend keygen`).
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub key: Option<PathBuf>,

    /// Run with no key: any client is accepted. For local play only.
    #[arg(long)]
    pub insecure: bool,

    /// Lock lent memory in RAM so it is never swapped out.
    #[arg(long)]
    pub mlock: bool,

    /// Fault all lent memory in up front instead of as it is written.
    #[arg(long)]
    pub prealloc: bool,

    /// This donor backs swap on its own host (its NBD export is swapped on by
    /// the same kernel): lock all its memory and mark it an I/O flusher, so a
    /// swap-out never waits on a daemon that itself waits for memory.
    #[arg(long)]
    pub swap_safe: bool,

    /// Most page-protocol connections at once.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,

    /// Most NBD connections at once.
    #[arg(long, default_value_t = 64)]
    pub max_nbd_connections: usize,

    /// Microseconds a connection thread polls for the next request before
    /// sleeping (0: never). Saves a ~10 µs cross-core wakeup per request for
    /// busy clients, at the cost of that much CPU when they pause.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub spin_us: u64,

    /// Seconds a borrower's slabs survive after its last connection drops.
    #[arg(long, default_value_t = 60)]
    pub orphan_grace_s: u64,
}

fn parse_export(text: &str) -> Result<(String, u64), String> {
    let (name, size) = text.split_once('=').ok_or("an export is NAME=SIZE")?;
    if name.len() > 4096 {
        return Err("an export name is at most 4096 bytes".into());
    }
    Ok((name.to_string(), memlend_node::size::parse_pages(size)?))
}
