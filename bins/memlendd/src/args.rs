use clap::Parser;
use memlend_net::SpinSetting;
use std::net::SocketAddr;
use std::path::PathBuf;

/// memlendd: lend this node's idle RAM to other nodes.
#[derive(Parser, Debug)]
#[command(version, about, args_override_self = true)]
pub struct Args {
    /// Read settings from this TOML file: each key is a flag's long name
    /// (`lend = "2G"`, `nbd_allow = ["10.0.0.0/24"]`, `mlock = true`).
    /// Flags on the command line override it (docs/config.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Check this config file (and the flags given with it) and exit:
    /// status 0 if memlendd would accept it.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    pub check_config: Option<PathBuf>,

    /// Write man pages and shell completions into DIR and exit (for
    /// packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    pub generate_docs: Option<PathBuf>,

    /// How much memory to lend in all, e.g. `2G`. Refused if the node cannot
    /// really give it. Required without --cluster; with it, a cap on what the
    /// classifier may lend.
    #[arg(long, value_parser = memlend_node::size::parse_pages, value_name = "SIZE")]
    pub lend: Option<u64>,

    /// Address for the page protocol (borrowers).
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Also serve NBD exports on this address. Plain NBD has no
    /// authentication, so an address off loopback needs --nbd-allow, or TLS
    /// with client certificates (--nbd-tls-client-ca).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<SocketAddr>,

    /// Also (or only) serve the NBD exports on a Unix socket at PATH, made
    /// mode 0660: the file's owner and group are who may connect, as
    /// --nbd-allow does not apply there. A stale socket left by a crash is
    /// replaced; the file is removed on a clean stop.
    #[arg(long, value_name = "PATH")]
    pub nbd_unix: Option<PathBuf>,

    /// Serve every NBD export read-only: clients are told so, and writes,
    /// trims and write-zeroes fail with EPERM. One export alone: --export
    /// NAME=SIZE,ro.
    #[arg(long)]
    pub nbd_read_only: bool,

    /// Require TLS (NBD STARTTLS) of every NBD client, showing this
    /// certificate chain (PEM). Needs --nbd-tls-key.
    #[arg(long, value_name = "FILE", requires = "nbd_tls_key")]
    pub nbd_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --nbd-tls-cert.
    #[arg(long, value_name = "FILE", requires = "nbd_tls_cert")]
    pub nbd_tls_key: Option<PathBuf>,

    /// With TLS, also require a client certificate issued by this CA (PEM):
    /// mutual authentication.
    #[arg(long, value_name = "FILE", requires = "nbd_tls_cert")]
    pub nbd_tls_client_ca: Option<PathBuf>,

    /// Clients allowed to use the NBD exports, as address blocks
    /// (`10.0.0.0/24`, `192.168.1.5`); repeatable. Others are closed at
    /// accept. Required when --nbd is not on loopback.
    #[arg(long, value_name = "CIDR")]
    pub nbd_allow: Vec<memlend_server::nbd::Cidr>,

    /// An NBD export `NAME=SIZE`, carved out of --lend; repeatable. The first
    /// one is also served for the empty name. `NAME=SIZE,ro` serves it
    /// read-only. Default with --nbd or --nbd-unix: one export `memlend` of
    /// the whole --lend.
    #[arg(long = "export", value_name = "NAME=SIZE[,ro]", value_parser = parse_export)]
    pub exports: Vec<ExportArg>,

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

    /// Microseconds a page-protocol connection thread polls for the next
    /// request before sleeping (0: never), while the borrower's recent
    /// requests came within it; past that it sleeps at once. `auto`: 200
    /// where waking a thread asleep on an idle core is dear (measured at
    /// start: a VM without guest halt polling), else 0.
    #[arg(long, default_value = "auto", value_name = "auto|US")]
    pub spin_us: SpinSetting,

    /// The nice value page-protocol connection threads poll at (0: their
    /// own), so that the poll takes only CPU no other thread wants; back at
    /// their own priority to serve. At 19 a busy donor's own work is not
    /// slowed and a borrower's p99 stays low: a poll at the thread's own
    /// priority queues behind that work for milliseconds. Needs
    /// CAP_SYS_NICE or RLIMIT_NICE to go back up (else left alone, and said
    /// once).
    #[arg(long, default_value_t = memlend_net::SPIN_NICE, value_name = "0..19",
          value_parser = clap::value_parser!(i32).range(0..=19))]
    pub spin_nice: i32,

    /// The same for NBD connections, which always spin this long (`auto`:
    /// 50 where a wake is dear, else 0).
    #[arg(long, default_value = "auto", value_name = "auto|US")]
    pub nbd_spin_us: SpinSetting,

    /// Most memory one borrower may hold here (default: all of --lend), so
    /// that one borrower cannot starve the others.
    #[arg(long, value_parser = memlend_node::size::parse_pages, value_name = "SIZE")]
    pub max_per_borrower: Option<u64>,

    /// Seconds a borrower's slabs survive after its last connection drops.
    #[arg(long, default_value_t = 60)]
    pub orphan_grace_s: u64,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// The ACMS control plane: classify this node, lend and borrow on its own.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Join a cluster: lend only through leases the control plane grants.
    #[arg(long = "cluster")]
    pub enabled: bool,

    /// This node's name (default: the host name); the same name after a
    /// restart is the same node.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,

    /// UDP address for control messages.
    #[arg(long, default_value = "0.0.0.0:7071", value_name = "ADDR")]
    pub control: SocketAddr,

    /// Broadcast address of the LAN, e.g. 10.77.0.255:7071.
    #[arg(long, value_name = "ADDR")]
    pub broadcast: Option<SocketAddr>,

    /// A peer's control address, for networks without broadcast; repeatable.
    #[arg(long = "seed", value_name = "ADDR")]
    pub seeds: Vec<SocketAddr>,

    /// The address peers use for this node's page protocol (default: the
    /// --listen address).
    #[arg(long, value_name = "IP")]
    pub advertise: Option<std::net::IpAddr>,

    /// Unix socket for local processes (`memlend run --pool`, `memlend status`).
    #[arg(long, default_value = "/run/memlend/memlendd.sock", value_name = "PATH")]
    pub api: PathBuf,

    /// Serve Prometheus metrics on this address.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,

    /// Where memory use comes from: `auto` (this process's memory cgroup if
    /// it has a limit, else the host), `host`, or a cgroup directory.
    #[arg(long, default_value = "auto", value_name = "SOURCE")]
    pub memory: String,

    /// MEM_MIN_LOW,MEM_MIN_HIGH,MEM_MAX_LOW,MEM_MAX_HIGH as fractions of
    /// node memory.
    #[arg(long, default_value = "0.40,0.50,0.75,0.85", value_name = "F,F,F,F")]
    pub thresholds: String,

    /// This node's failure domain (a rack, a zone, any label up to 32
    /// bytes): the two copies of a mirrored lease go to donors in different
    /// domains when the cluster has them.
    #[arg(long, value_name = "LABEL", value_parser = parse_domain)]
    pub domain: Option<String>,

    /// How to choose among donors: first, round-robin, nearest, most-free,
    /// balanced (RTT and room weighed together).
    #[arg(long, default_value = "first", value_name = "POLICY")]
    pub selector: String,

    /// A borrower has this long to move a reclaimed lease's pages away
    /// before this donor revokes the lease.
    #[arg(long, default_value_t = 30_000, value_name = "MS",
          value_parser = clap::value_parser!(u32).range(100..=600_000))]
    pub reclaim_deadline_ms: u32,

    /// Write what the node does (a sample a second, every control message)
    /// to this file, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
}

/// One `--export`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportArg {
    pub name: String,
    pub pages: u64,
    pub read_only: bool,
}

fn parse_export(text: &str) -> Result<ExportArg, String> {
    let (name, rest) = text.split_once('=').ok_or("an export is NAME=SIZE or NAME=SIZE,ro")?;
    if name.len() > 4096 {
        return Err("an export name is at most 4096 bytes".into());
    }
    let (size, read_only) = match rest.split_once(',') {
        None => (rest, false),
        Some((size, "ro")) => (size, true),
        Some((_, other)) => return Err(format!("unknown export option `{other}` (only `ro`)")),
    };
    let pages = memlend_node::size::parse_pages(size)?;
    Ok(ExportArg { name: name.to_string(), pages, read_only })
}

fn parse_domain(s: &str) -> Result<String, String> {
    let max = memlend_wire::ctrl::DOMAIN_BYTES_MAX;
    if s.is_empty() || s.len() > max {
        return Err(format!("a domain is 1 to {max} bytes, not {}", s.len()));
    }
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("a domain has no spaces or control characters".into());
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_parse_with_and_without_ro() {
        let a = parse_export("a=1M").unwrap();
        assert_eq!(a, ExportArg { name: "a".into(), pages: 256, read_only: false });
        let b = parse_export("b,c=8K,ro").unwrap();
        assert_eq!(b, ExportArg { name: "b,c".into(), pages: 2, read_only: true });
        assert!(parse_export("a=1M,rw").unwrap_err().contains("`rw`"));
        assert!(parse_export("a").is_err());
        assert!(parse_export("a=,ro").is_err());
    }

    #[test]
    fn domains_are_short_printable_labels() {
        assert_eq!(parse_domain("rack-7").unwrap(), "rack-7");
        assert!(parse_domain("").is_err());
        assert!(parse_domain(&"r".repeat(33)).unwrap_err().contains("33"));
        assert!(parse_domain("rack 7").is_err());
    }
}
