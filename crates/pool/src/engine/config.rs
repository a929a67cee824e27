//! The engine's settings. Every timer and limit is here, with its unit.

use memlend_wire::ctrl::NodeId;
use std::net::SocketAddr;

/// Microseconds per millisecond: the engine keeps time in µs (loopback RTTs
/// are tens of µs), settings are in ms.
pub const MS: u64 = 1_000;

#[derive(Clone, Debug)]
pub struct Config {
    pub node: NodeId,
    pub name: String,
    /// The failure domain this node sits in (a rack, a zone), told to peers
    /// in heartbeats; empty for none.
    pub domain: String,
    /// Where this node serves the page protocol (named in grants).
    pub data_addr: SocketAddr,
    /// Broadcast reaches the peers (a LAN); else `seeds` and peers heard.
    pub broadcast: bool,
    pub seeds: Vec<SocketAddr>,
    /// Secret behind lease credentials (random per daemon start).
    pub credential_secret: [u8; 32],
    /// Heartbeats between lease partners (and the floor of the summary
    /// refresh).
    pub heartbeat_ms: u64,
    /// A lease partner silent this long: suspect (no new grants to or from
    /// it). Other peers: several refresh periods (`engine/summary.rs`).
    pub suspect_ms: u64,
    /// A lease partner silent this long: gone; its leases are revoked or
    /// lost.
    pub dead_ms: u64,
    /// About how many periodic summaries a node receives per second from the
    /// whole cluster: each node refreshes its own every members / this
    /// seconds (at least `heartbeat_ms`, at most `refresh_max_ms`).
    pub summaries_per_s: u64,
    pub refresh_max_ms: u64,
    /// Offers back off from min to max while availability is stable.
    pub offer_min_ms: u64,
    pub offer_max_ms: u64,
    /// A grant not ACKed within this is freed.
    pub grant_ack_ms: u32,
    /// After the first grant, wait this long for others before choosing.
    pub grant_window_ms: u64,
    /// Retransmission of requests and ACKs: first wait, doubling to max.
    pub retry_min_ms: u64,
    pub retry_max_ms: u64,
    /// Attempts before a request or an ACK is given up.
    pub retry_attempts: u32,
    /// How long a borrower has to move a reclaimed lease away.
    pub reclaim_deadline_ms: u32,
    /// A lease its borrower has not reported for this long is stranded.
    pub stranded_ms: u64,
    /// Grants are whole multiples of this.
    pub grant_unit_bytes: u64,
    /// Most leases this node lends at once, and borrows at once.
    pub lent_max: usize,
    pub borrowed_max: usize,
    /// Most outstanding local demands.
    pub demands_max: usize,
    /// Servers a request goes to at first (doubling with each retry), when
    /// servers do not broadcast offers.
    pub request_fanout: usize,
}

impl Config {
    pub fn new(
        node: NodeId,
        name: &str,
        data_addr: SocketAddr,
        credential_secret: [u8; 32],
    ) -> Config {
        Config {
            node,
            name: name.to_string(),
            domain: String::new(),
            data_addr,
            broadcast: true,
            seeds: Vec::new(),
            credential_secret,
            heartbeat_ms: 500,
            suspect_ms: 1_500,
            dead_ms: 3_000,
            summaries_per_s: 4,
            refresh_max_ms: 300_000,
            offer_min_ms: 250,
            offer_max_ms: 4_000,
            grant_ack_ms: 2_000,
            grant_window_ms: 20,
            retry_min_ms: 100,
            retry_max_ms: 1_600,
            retry_attempts: 6,
            reclaim_deadline_ms: 30_000,
            stranded_ms: 5_000,
            grant_unit_bytes: 1 << 20,
            lent_max: 256,
            borrowed_max: memlend_wire::ctrl::HEARTBEAT_LEASES_MAX,
            demands_max: 64,
            request_fanout: 3,
        }
    }

    /// Wait (µs) before attempt `n` (0-based) of a retransmission.
    pub fn retry_us(&self, attempt: u32) -> u64 {
        (self.retry_min_ms << attempt.min(16)).min(self.retry_max_ms) * MS
    }
}
