//! The network: one broadcast domain; each copy of a datagram to each
//! receiver is lost, duplicated and delayed independently (base latency plus
//! exponential jitter), so jitter also reorders.

use crate::rng::Rng;
use memlend_wire::ctrl::{Body, NodeId};

#[derive(Clone, Copy, Debug)]
pub struct NetParams {
    /// One-way latency floor, µs (at least 1, so time always moves on).
    pub latency_us: u64,
    /// Mean of the exponential jitter added to it, µs.
    pub jitter_us: u64,
    /// Probability that a copy to one receiver is lost.
    pub loss: f64,
    /// Probability that a copy that arrives arrives twice.
    pub dup: f64,
}

impl Default for NetParams {
    fn default() -> NetParams {
        // A switched LAN: ~60 µs one way, a tail of a few hundred µs.
        NetParams { latency_us: 50, jitter_us: 30, loss: 0.0, dup: 0.0 }
    }
}

/// One datagram as sent: its envelope fields, its encoded size, its body.
/// Shared by every receiver of a broadcast.
pub struct Datagram {
    pub from: u32,
    pub sender: NodeId,
    pub incarnation: u64,
    pub counter: u64,
    pub bytes: u32,
    pub body: Body,
}

impl NetParams {
    /// Copies that arrive at one receiver: 0 (lost), 1 or 2 (duplicated).
    pub fn copies(&self, rng: &mut Rng) -> u32 {
        if rng.unit() < self.loss {
            return 0;
        }
        if rng.unit() < self.dup {
            2
        } else {
            1
        }
    }

    pub fn delay_us(&self, rng: &mut Rng) -> u64 {
        self.latency_us.max(1) + rng.exp(self.jitter_us as f64) as u64
    }
}
