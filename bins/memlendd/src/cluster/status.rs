//! The engine's state as `memlend status` and the metrics endpoint see it.

use super::transport::TransportStats;
use memlend_pool::api::{ClusterStatus, LeaseView, NodeView};
use memlend_pool::engine::{BorrowedState, Engine, LentState, KINDS};
use memlend_wire::ctrl::NodeClass;

pub fn class_name(c: NodeClass) -> &'static str {
    match c {
        NodeClass::Neutral => "neutral",
        NodeClass::Server => "server",
        NodeClass::Client => "client",
    }
}

pub fn snapshot(e: &Engine, t: &TransportStats) -> ClusterStatus {
    let cfg = e.config();
    let st = e.status();
    let node = NodeView {
        id: cfg.node,
        name: cfg.name.clone(),
        class: class_name(st.class).into(),
        total_bytes: st.total_bytes,
        used_bytes: st.used_bytes,
        lent_bytes: e.lent_bytes(),
        borrowed_bytes: e.borrowed_bytes(),
        available_bytes: e.available_bytes(),
        alive: true,
        addr: cfg.data_addr.to_string(),
    };
    let peers = e
        .members()
        .iter()
        .map(|p| NodeView {
            id: p.node,
            name: p.name.clone(),
            class: class_name(p.class).into(),
            total_bytes: p.total_bytes,
            used_bytes: p.used_bytes,
            lent_bytes: p.lent_bytes,
            borrowed_bytes: p.borrowed_bytes,
            available_bytes: p.available_bytes,
            alive: !p.suspect,
            addr: p.ctrl_addr.to_string(),
        })
        .collect();
    let lent = e
        .lent()
        .map(|l| LeaseView {
            lease: l.lease,
            peer: l.borrower,
            bytes: l.bytes,
            state: match l.state {
                LentState::Granted { .. } => "granted",
                LentState::Active => "active",
                LentState::Reclaiming { .. } => "reclaiming",
            }
            .into(),
            pages_per_s: l.pages_per_s,
        })
        .collect();
    let borrowed = e
        .borrowed()
        .map(|b| LeaseView {
            lease: b.lease,
            peer: b.donor,
            bytes: b.bytes,
            state: match b.state {
                BorrowedState::Binding => "binding",
                BorrowedState::Active => "active",
                BorrowedState::Reclaimed { .. } => "reclaimed",
            }
            .into(),
            pages_per_s: b.pages_per_s,
        })
        .collect();
    let m = e.metrics();
    let by_kind = |v: &[u64; 7]| KINDS.iter().zip(v).map(|(k, n)| (k.to_string(), *n)).collect();
    ClusterStatus {
        node,
        peers,
        lent,
        borrowed,
        unmet_bytes: e.unmet_demand_bytes(),
        handshakes: m.handshakes,
        handshake_us_p50: m.handshake_quantile_us(0.5),
        handshake_us_p99: m.handshake_quantile_us(0.99),
        sent: by_kind(&m.sent),
        received: by_kind(&m.received),
        datagrams: [
            ("sent", t.sent),
            ("send_errors", t.send_errors),
            ("received", t.received),
            ("rejected", t.rejected),
            ("replayed", t.replayed),
            ("foreign", t.foreign),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect(),
        counters: m.counters().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    }
}
