//! What `memlend top` shows, as lines of text: the same lines on the
//! terminal view (`mod.rs`) and on stdout with `--once`.

use memlend_node::live::Proc;
use memlend_node::size::human;
use memlend_pool::api::{ClusterStatus, LeaseView, NodeView};

/// One look: the local daemon's view (or why there is none), and the
/// processes.
pub struct Snapshot {
    pub api: String,
    pub node: Result<ClusterStatus, String>,
    pub procs: Vec<Proc>,
}

/// A line and whether it is a heading.
pub type Line = (String, bool);

pub fn lines(s: &Snapshot) -> Vec<Line> {
    let mut out = Vec::new();
    match &s.node {
        Ok(st) => node_lines(st, &mut out),
        Err(why) => out.push((format!("node: no memlendd at {} ({why})", s.api), false)),
    }
    out.push((String::new(), false));
    proc_lines(&s.procs, &mut out);
    out
}

fn node_lines(st: &ClusterStatus, out: &mut Vec<Line>) {
    let head = format!(
        "{:<14} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "NODE", "CLASS", "TOTAL", "USED", "LENT", "BORROWED", "FREE"
    );
    out.push((head, true));
    let row = |n: &NodeView, note: &str| {
        let free = if n.available_bytes > 0 { human(n.available_bytes) } else { "-".into() };
        let (total, used, lent) = (human(n.total_bytes), human(n.used_bytes), human(n.lent_bytes));
        format!(
            "{:<14} {:<8} {total:>9} {used:>9} {lent:>9} {:>9} {free:>9}  {note}",
            n.name,
            n.class,
            human(n.borrowed_bytes)
        )
    };
    out.push((row(&st.node, "(this node)"), false));
    for p in &st.peers {
        out.push((row(p, if p.alive { "" } else { "(suspect)" }), false));
    }
    let peer = |id| st.peers.iter().find(|p| p.id == id);
    let mut leases = |role: &str, v: &[LeaseView]| {
        for l in v {
            let (name, health) = match peer(l.peer) {
                Some(p) => (p.name.clone(), if p.alive { "alive" } else { "suspect" }),
                None => (format!("{:016x}", l.peer), "unknown"),
            };
            out.push((
                format!(
                    "  lease {:<6} {role:<4} {name:<14} {:>9}  {:<10} {:>7} pages/s  {health}",
                    l.lease,
                    human(l.bytes),
                    l.state,
                    l.pages_per_s
                ),
                false,
            ));
        }
    };
    leases("to", &st.lent);
    leases("from", &st.borrowed);
    if st.unmet_bytes > 0 {
        out.push((format!("  wanted and not yet granted: {}", human(st.unmet_bytes)), false));
    }
}

fn proc_lines(procs: &[Proc], out: &mut Vec<Line>) {
    let head = format!(
        "{:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>7}  {}",
        "PID",
        "RSS",
        "FAR RES",
        "BUDGET",
        "FAR",
        "STORE/s",
        "POOL/s",
        "MISS p50",
        "p99 us",
        "PREFETCH",
        "POOL x",
        "COMMAND (store)"
    );
    out.push((head, true));
    if procs.is_empty() {
        out.push(("  no process borrows far memory here now (memlend run)".into(), false));
    }
    let rate = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.0}"));
    for p in procs {
        let prefetch = format!("{}/{}", p.prefetch_hits, p.prefetch_hits + p.prefetch_wasted);
        let ratio = p.pool_ratio.map_or("-".into(), |r| format!("{r:.1}"));
        out.push((
            format!(
                "{:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8.1} {:>8.1} {prefetch:>9} {ratio:>7}  {} ({})",
                p.pid,
                human(p.rss_bytes),
                human(p.resident_far_bytes),
                human(p.budget_bytes),
                human(p.far_bytes),
                rate(p.store_faults_per_s),
                rate(p.pool_faults_per_s),
                p.miss_us_p50,
                p.miss_us_p99,
                p.command,
                p.store
            ),
            false,
        ));
    }
}
