//! Counters the daemon exports (Prometheus) and `memlend status` shows.

use memlend_wire::ctrl::Body;

/// Message types in wire order, for per-type counters.
pub const KINDS: [&str; 7] =
    ["offer", "request", "grant", "ack", "reclaim", "release", "heartbeat"];
/// Handshake latencies kept for percentiles (the most recent ones).
pub const LATENCY_SAMPLES: usize = 1024;

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub sent: [u64; 7],
    pub received: [u64; 7],
    pub class_changes: u64,
    pub grants_expired: u64,
    pub leases_stranded: u64,
    pub reclaims_sent: u64,
    pub reclaims_overdue: u64,
    pub demands_unmet: u64,
    pub leases_lost: u64,
    /// Reclaimed leases the borrower released (its pages moved away).
    pub migrations: u64,
    /// Request sent to lease confirmed, in µs; a ring of the latest.
    pub handshake_us: Vec<u64>,
    handshake_next: usize,
    pub handshakes: u64,
}

pub fn kind(body: &Body) -> usize {
    match body {
        Body::Offer(_) => 0,
        Body::Request(_) => 1,
        Body::Grant(_) => 2,
        Body::Ack(_) => 3,
        Body::Reclaim(_) => 4,
        Body::Release(_) => 5,
        Body::Heartbeat(_) => 6,
    }
}

impl Metrics {
    pub fn sent(&mut self, body: &Body) {
        self.sent[kind(body)] += 1;
    }

    pub fn received(&mut self, body: &Body) {
        self.received[kind(body)] += 1;
    }

    pub fn handshake(&mut self, us: u64) {
        self.handshakes += 1;
        if self.handshake_us.len() < LATENCY_SAMPLES {
            self.handshake_us.push(us);
        } else {
            self.handshake_us[self.handshake_next] = us;
        }
        self.handshake_next = (self.handshake_next + 1) % LATENCY_SAMPLES;
    }

    /// Named counters, for status and metrics.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("class_changes", self.class_changes),
            ("grants_expired", self.grants_expired),
            ("leases_stranded", self.leases_stranded),
            ("reclaims_sent", self.reclaims_sent),
            ("reclaims_overdue", self.reclaims_overdue),
            ("demands_unmet", self.demands_unmet),
            ("leases_lost", self.leases_lost),
            ("migrations", self.migrations),
        ]
    }

    /// The `q` quantile (0..=1) of the kept handshake latencies.
    pub fn handshake_quantile_us(&self, q: f64) -> Option<u64> {
        let mut v = self.handshake_us.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(v[i])
    }
}
