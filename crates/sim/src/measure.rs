//! What a run counts while it runs (`Counters`) and what it reports
//! (`Outcome`, deterministic for a seed; `Cost`, the simulator's own wall
//! time and memory, which are not).

use memlend_pool::engine::KINDS;
use serde::Serialize;
use std::collections::BTreeMap;

/// Demand-to-lease latencies kept; later ones are counted, not kept.
pub const LATENCY_SAMPLES_MAX: usize = 1 << 20;
/// Seconds at the start left out of harvest: the classifier needs its hold
/// time (5 s) and two samples before any node is a server.
pub const WARMUP_S: u64 = 10;

#[derive(Default)]
pub struct Counters {
    pub msgs_sent: u64,
    pub bytes_sent: u64,
    pub msgs_recv: u64,
    pub bytes_recv: u64,
    /// Bytes sent and received from the end of warm-up on: the steady
    /// state, without the burst of every node booting and announcing
    /// itself in the first seconds.
    pub bytes_sent_warm: u64,
    pub bytes_recv_warm: u64,
    pub bytes_sent_by_kind: [u64; 7],
    pub lost: u64,
    pub duplicated: u64,
    pub dropped_down: u64,
    pub replays_refused: u64,
    pub crashes: u64,
    pub latencies_us: Vec<u64>,
    pub latencies_not_kept: u64,
    pub episodes_withdrawn: u64,
    /// Sums over each simulated second after warm-up, bytes.
    pub harvest_sum: f64,
    pub oracle_sum: f64,
    pub lent_sum: f64,
    pub harvest_samples: u64,
    /// Where second copies landed, when borrowers mirror.
    pub mirrors: crate::mirrors::Mirrors,
    /// What a partition dropped and left behind.
    pub partition: crate::partition::PartitionOutcome,
    pub events: u64,
    pub trace_hash: u64,
}

impl Counters {
    pub fn new() -> Counters {
        Counters { trace_hash: 0xcbf2_9ce4_8422_2325, ..Default::default() }
    }

    /// FNV-1a over every datagram sent and its send time.
    pub fn hash(&mut self, now_us: u64, bytes: &[u8]) {
        for &b in now_us.to_le_bytes().iter().chain(bytes) {
            self.trace_hash = (self.trace_hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    pub fn latency(&mut self, us: u64) {
        if self.latencies_us.len() < LATENCY_SAMPLES_MAX {
            self.latencies_us.push(us);
        } else {
            self.latencies_not_kept += 1;
        }
    }
}

/// Everything a run measured; the same for the same parameters.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub nodes: usize,
    pub seconds: u64,
    pub seed: u64,
    pub loss: f64,
    pub dup: f64,
    pub crashes: u64,
    pub msgs_sent_per_node_s: f64,
    pub bytes_sent_per_node_s: f64,
    pub msgs_recv_per_node_s: f64,
    pub bytes_recv_per_node_s: f64,
    /// The same after warm-up (None if the run is no longer than it).
    pub bytes_sent_per_node_s_warm: Option<f64>,
    pub bytes_recv_per_node_s_warm: Option<f64>,
    /// Bytes sent of each message type (all nodes, whole run).
    pub bytes_sent_by_kind: BTreeMap<String, u64>,
    pub lost: u64,
    pub duplicated: u64,
    pub replays_refused: u64,
    pub dropped_at_down_node: u64,
    pub queue_full_drops: u64,
    pub queue_peak: usize,
    /// Demand to lease: from the sample where a node first wants more than
    /// its active leases to the lease that covers it.
    pub demand_met: u64,
    pub demand_withdrawn: u64,
    pub demand_open_at_end: u64,
    pub lease_latency_ms_p50: Option<f64>,
    pub lease_latency_ms_p99: Option<f64>,
    pub lease_latency_ms_max: Option<f64>,
    pub need_end_bytes: u64,
    pub unmet_end_bytes: u64,
    /// Useful bytes borrowed over the oracle, after warm-up.
    pub harvest_pct: Option<f64>,
    pub harvest_mean_bytes: f64,
    pub oracle_mean_bytes: f64,
    pub lent_mean_bytes: f64,
    pub stranded_end: u64,
    pub leases_end: u64,
    pub class_changes_per_node_min: f64,
    /// Failure domains named (0: none) and whether borrowers mirror.
    pub racks: usize,
    pub mirror: Option<crate::mirrors::MirrorOutcome>,
    pub partition: Option<crate::partition::PartitionOutcome>,
    /// Engine counters summed over nodes (and crashed incarnations).
    pub engine: BTreeMap<String, u64>,
    pub events: u64,
    pub trace_hash: String,
}

/// The simulator's own cost: differs between runs of the same seed.
#[derive(Clone, Debug, Serialize)]
pub struct Cost {
    pub wall_ms: u64,
    /// The process's peak resident memory so far (VmHWM): with several runs
    /// in one process, the largest run's.
    pub peak_rss_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub outcome: Outcome,
    pub cost: Cost,
}

/// The `q` quantile, nearest rank, in ms.
pub fn quantile_ms(sorted_us: &[u64], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = ((sorted_us.len() as f64 * q).ceil() as usize).clamp(1, sorted_us.len());
    Some(sorted_us[rank - 1] as f64 / 1_000.0)
}

pub fn by_kind(v: &[u64; 7]) -> BTreeMap<String, u64> {
    KINDS.iter().zip(v).map(|(k, n)| (k.to_string(), *n)).collect()
}

pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
