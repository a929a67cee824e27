//! `memlend sim`: the ACMS control plane of N simulated nodes (the real
//! engine and classifier, a seeded network), one run per node count; a
//! table or JSON of what each run measured. See `docs/scale.md`.

use anyhow::{bail, Result};
use clap::Args;
use memlend_sim::scenario::Scenario;
use memlend_sim::{NetParams, Params, Partition, Report};

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Nodes; a comma-separated list runs each in turn (10,100,1000).
    #[arg(long, default_value = "10")]
    pub nodes: String,
    /// Simulated seconds per run.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Probability that a datagram to one receiver is lost.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Probability that a datagram that arrives arrives twice.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// One-way latency floor and mean exponential jitter, µs.
    #[arg(long, default_value_t = 50)]
    pub latency_us: u64,
    #[arg(long, default_value_t = 30)]
    pub jitter_us: u64,
    /// Share of nodes that only lend.
    #[arg(long, default_value_t = 0.5)]
    pub lenders: f64,
    /// Node crashes per run, each restarted 2 to 10 s later.
    #[arg(long, default_value_t = 0)]
    pub crashes: usize,
    /// Failure domains: node i sits in rack i mod RACKS (0: none named).
    #[arg(long, default_value_t = 0)]
    pub racks: usize,
    /// Every borrower keeps two copies, each leg avoiding the other's
    /// donors (`--redundancy mirror`); the table adds where they landed.
    #[arg(long)]
    pub mirror: bool,
    /// One network partition: START_S,HEAL_S,SHARE (the lowest-numbered
    /// SHARE of the nodes on one side); leases are checked 30 s after the
    /// heal, which must come before the end.
    #[arg(long, value_name = "START_S,HEAL_S,SHARE", value_parser = Partition::parse)]
    pub partition: Option<Partition>,
    /// Scripted nodes instead of generated ones: a JSON file of each node's
    /// memory, its own use and its far-memory jobs (`crates/sim/src/
    /// scenario.rs`); the node count is the file's.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<std::path::PathBuf>,
    /// How every node chooses among grants: first, round-robin, nearest,
    /// most-free or balanced (as `memlendd --selector`).
    #[arg(long, default_value = "first", value_name = "POLICY")]
    pub selector: memlend_pool::select::SelectorKind,
    /// No broadcast: the first SEEDS nodes are every node's seed list and
    /// heartbeats go by unicast to seeds and peers heard (`memlendd --seed`).
    #[arg(long, default_value_t = 0, value_name = "SEEDS")]
    pub seeds: usize,
    /// Print a JSON array of reports instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &SimArgs) -> Result<()> {
    let scenario = match &a.scenario {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            Some(Scenario::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    let counts = match &scenario {
        Some(s) => vec![s.nodes.len()],
        None => node_counts(&a.nodes)?,
    };
    let net =
        NetParams { latency_us: a.latency_us, jitter_us: a.jitter_us, loss: a.loss, dup: a.dup };
    let mut reports = Vec::new();
    if !a.json {
        let mirror = if a.mirror { mirror_header() } else { String::new() };
        let cut = if a.partition.is_some() { partition_header() } else { String::new() };
        println!("{}{mirror}{cut}", header());
    }
    for nodes in counts {
        let p = Params {
            net,
            lender_share: a.lenders,
            crashes: a.crashes,
            racks: a.racks,
            mirror: a.mirror,
            partition: a.partition,
            scenario: scenario.clone(),
            selector: a.selector,
            seeds: a.seeds,
            ..Params::new(nodes, a.seconds, a.seed)
        };
        let r = memlend_sim::run(&p).map_err(anyhow::Error::msg)?;
        if !a.json {
            println!("{}{}{}", row(&r), mirror_row(&r), partition_row(&r));
        }
        reports.push(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(())
}

fn node_counts(spec: &str) -> Result<Vec<usize>> {
    let mut v = Vec::new();
    for s in spec.split(',').filter(|s| !s.trim().is_empty()) {
        match s.trim().parse::<usize>() {
            Ok(n) => v.push(n),
            Err(e) => bail!("--nodes {s:?}: {e}"),
        }
    }
    if v.is_empty() {
        bail!("--nodes names no node count");
    }
    Ok(v)
}

fn header() -> String {
    format!(
        "{:>6} {:>5} {:>5} {:>8} {:>9} {:>8} {:>9} {:>9} {:>8} {:>8} {:>7} {:>9} {:>8} {:>8} {:>7} {:>7} {:>8}",
        "nodes", "secs", "loss", "tx_msg/s", "tx_KB/s", "rx_msg/s", "rx_KB/s", "rx>10s", "p50_ms", "p99_ms",
        "met", "unmet_GiB", "harvest%", "strand", "cls/min", "wall_s", "rss_MiB"
    )
}

fn row(r: &Report) -> String {
    let o = &r.outcome;
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
    format!(
        "{:>6} {:>5} {:>5.2} {:>8.1} {:>9.2} {:>8.1} {:>9.2} {:>9} {:>8} {:>8} {:>7} {:>9.2} {:>8} {:>8} {:>7.2} {:>7.1} {:>8}",
        o.nodes,
        o.seconds,
        o.loss,
        o.msgs_sent_per_node_s,
        o.bytes_sent_per_node_s / 1e3,
        o.msgs_recv_per_node_s,
        o.bytes_recv_per_node_s / 1e3,
        o.bytes_recv_per_node_s_warm.map_or("-".to_string(), |b| format!("{:.2}", b / 1e3)),
        ms(o.lease_latency_ms_p50),
        ms(o.lease_latency_ms_p99),
        o.demand_met,
        o.unmet_end_bytes as f64 / (1u64 << 30) as f64,
        o.harvest_pct.map_or("-".to_string(), |h| format!("{h:.1}")),
        o.stranded_end,
        o.class_changes_per_node_min,
        r.cost.wall_ms as f64 / 1e3,
        r.cost.peak_rss_bytes >> 20,
    )
}

fn mirror_header() -> String {
    format!(" {:>6} {:>9} {:>10}", "racks", "2nd_GiB", "same_dom%")
}

/// Where second copies landed: their mean size, and the share in a failure
/// domain of the first copy (a share on the same donor is never allowed,
/// and shown only if it happened).
fn mirror_row(r: &Report) -> String {
    let Some(m) = &r.outcome.mirror else { return String::new() };
    let mut s = format!(
        " {:>6} {:>9.2} {:>10.2}",
        r.outcome.racks,
        m.second_copy_mean_bytes / (1u64 << 30) as f64,
        m.same_domain_pct
    );
    if m.same_node_pct > 0.0 {
        s.push_str(&format!("  SAME DONOR {:.2}%", m.same_node_pct));
    }
    s
}

fn partition_header() -> String {
    format!(" {:>9} {:>10} {:>8}", "cut_drops", "strand@+30", "leases")
}

/// Datagrams the partition dropped, and leases stranded (and held) 30 s
/// after it healed.
fn partition_row(r: &Report) -> String {
    let Some(c) = &r.outcome.partition else { return String::new() };
    format!(" {:>9} {:>10} {:>8}", c.dropped, c.stranded_after_heal, c.leases_after_heal)
}
