//! The end of a run: leases each side believes in, demand left, rates per
//! node and second, and the report.

use crate::measure::{by_kind, peak_rss_bytes, quantile_ms, Cost, Outcome, Report, WARMUP_S};
use crate::sim::Sim;
use memlend_pool::engine::Metrics;
use std::time::Duration;

pub(crate) fn report(sim: &Sim, wall: Duration) -> Report {
    let m = &sim.m;
    let p = &sim.p;
    let per_node_s = |x: u64| x as f64 / p.nodes as f64 / p.seconds as f64;
    let warm_s = p.seconds.saturating_sub(WARMUP_S);
    let per_node_warm_s = |x: u64| (warm_s > 0).then(|| x as f64 / p.nodes as f64 / warm_s as f64);
    let mut lat = m.latencies_us.clone();
    lat.sort_unstable();
    let engine = engine_totals(sim);
    let (stranded_end, leases_end) = crate::node::stranded(&sim.nodes);
    let up = || sim.nodes.iter().filter(|n| n.up);
    let need_end_bytes: u64 = up().map(|n| n.need_bytes).sum();
    let unmet_end_bytes: u64 =
        up().map(|n| n.need_bytes.saturating_sub(n.active_borrowed_bytes())).sum();
    let samples = m.harvest_samples.max(1) as f64;
    let outcome = Outcome {
        nodes: p.nodes,
        seconds: p.seconds,
        seed: p.seed,
        loss: p.net.loss,
        dup: p.net.dup,
        crashes: m.crashes,
        msgs_sent_per_node_s: per_node_s(m.msgs_sent),
        bytes_sent_per_node_s: per_node_s(m.bytes_sent),
        msgs_recv_per_node_s: per_node_s(m.msgs_recv),
        bytes_recv_per_node_s: per_node_s(m.bytes_recv),
        bytes_sent_per_node_s_warm: per_node_warm_s(m.bytes_sent_warm),
        bytes_recv_per_node_s_warm: per_node_warm_s(m.bytes_recv_warm),
        bytes_sent_by_kind: by_kind(&m.bytes_sent_by_kind),
        lost: m.lost,
        duplicated: m.duplicated,
        replays_refused: m.replays_refused,
        dropped_at_down_node: m.dropped_down,
        queue_full_drops: sim.queue.full_drops,
        queue_peak: sim.queue.peak_len,
        demand_met: lat.len() as u64 + m.latencies_not_kept,
        demand_withdrawn: m.episodes_withdrawn,
        demand_open_at_end: up().filter(|n| n.demand_since_us.is_some()).count() as u64,
        lease_latency_ms_p50: quantile_ms(&lat, 0.50),
        lease_latency_ms_p99: quantile_ms(&lat, 0.99),
        lease_latency_ms_max: quantile_ms(&lat, 1.0),
        need_end_bytes,
        unmet_end_bytes,
        harvest_pct: (m.oracle_sum > 0.0).then(|| 100.0 * m.harvest_sum / m.oracle_sum),
        harvest_mean_bytes: m.harvest_sum / samples,
        oracle_mean_bytes: m.oracle_sum / samples,
        lent_mean_bytes: m.lent_sum / samples,
        stranded_end,
        leases_end,
        class_changes_per_node_min: engine.class_changes as f64
            / p.nodes as f64
            / (p.seconds as f64 / 60.0),
        racks: p.racks,
        mirror: p.mirror.then(|| m.mirrors.outcome(samples)),
        partition: p.partition.map(|c| crate::partition::PartitionOutcome {
            start_s: c.start_s,
            heal_s: c.heal_s,
            share: c.share,
            ..m.partition.clone()
        }),
        engine: engine.counters().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        events: m.events,
        trace_hash: format!("{:016x}", m.trace_hash),
    };
    let cost = Cost { wall_ms: wall.as_millis() as u64, peak_rss_bytes: peak_rss_bytes() };
    Report { outcome, cost }
}

fn engine_totals(sim: &Sim) -> Metrics {
    let mut t = Metrics::default();
    for n in &sim.nodes {
        let m = n.metrics();
        t.class_changes += m.class_changes;
        t.grants_expired += m.grants_expired;
        t.leases_stranded += m.leases_stranded;
        t.reclaims_sent += m.reclaims_sent;
        t.reclaims_overdue += m.reclaims_overdue;
        t.demands_unmet += m.demands_unmet;
        t.leases_lost += m.leases_lost;
        t.migrations += m.migrations;
    }
    t
}
