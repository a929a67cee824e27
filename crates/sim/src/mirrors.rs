//! Where mirrored borrows landed (`Params::mirror`): each second after
//! warm-up, every second-copy lease is checked against the donors of its
//! node's first copies. On the same donor it would lose both copies with
//! one node; in the same failure domain, both with one rack.

use crate::node::{SimNode, OWNER, OWNER_B};
use memlend_pool::engine::BorrowedState;
use memlend_wire::ctrl::NodeId;
use serde::Serialize;
use std::collections::HashMap;

/// Sums over samples, in bytes.
#[derive(Clone, Debug, Default)]
pub struct Mirrors {
    pub second_copy_bytes: f64,
    pub same_node_bytes: f64,
    pub same_domain_bytes: f64,
}

/// What a run reports of them.
#[derive(Clone, Debug, Serialize)]
pub struct MirrorOutcome {
    /// Share of second-copy bytes on a donor of the first copy (never
    /// allowed) and in a failure domain of one (allowed when no other
    /// domain has room).
    pub same_node_pct: f64,
    pub same_domain_pct: f64,
    pub second_copy_mean_bytes: f64,
}

impl Mirrors {
    /// Look at node `n`'s second copies now; `domains` by node id.
    pub fn add(&mut self, n: &SimNode, domains: &HashMap<NodeId, String>) {
        let first = n.donors_of(OWNER);
        let domain = |d: &NodeId| domains.get(d).map(String::as_str).unwrap_or("");
        let first_domains: Vec<&str> = first.iter().map(domain).filter(|d| !d.is_empty()).collect();
        let second =
            n.engine.borrowed().filter(|b| b.owner == OWNER_B && b.state == BorrowedState::Active);
        for b in second {
            let bytes = b.bytes as f64;
            self.second_copy_bytes += bytes;
            if first.contains(&b.donor) {
                self.same_node_bytes += bytes;
            } else if first_domains.contains(&domain(&b.donor)) {
                self.same_domain_bytes += bytes;
            }
        }
    }

    pub fn outcome(&self, samples: f64) -> MirrorOutcome {
        let pct = |b: f64| {
            if self.second_copy_bytes > 0.0 {
                100.0 * b / self.second_copy_bytes
            } else {
                0.0
            }
        };
        MirrorOutcome {
            same_node_pct: pct(self.same_node_bytes),
            same_domain_pct: pct(self.same_domain_bytes),
            second_copy_mean_bytes: self.second_copy_bytes / samples.max(1.0),
        }
    }
}
