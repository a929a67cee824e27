//! The engine's records: what the node lends, what it borrows, what it wants.

use memlend_wire::ctrl::{Credential, LeaseId, LeaseReport, NodeClass, NodeId};
use std::net::SocketAddr;

/// The node as the monitor and classifier see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub class: NodeClass,
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// How much this node may lend in all (leases included).
    pub lendable_bytes: u64,
}

impl Default for Status {
    fn default() -> Status {
        Status { class: NodeClass::Neutral, total_bytes: 0, used_bytes: 0, lendable_bytes: 0 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LentState {
    /// Granted, waiting for the ACK until `expires_us`.
    Granted {
        expires_us: u64,
    },
    Active,
    /// RECLAIM sent; the borrower must release by `deadline_us`.
    Reclaiming {
        deadline_us: u64,
        next_send_us: u64,
    },
}

/// A lease this node lends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lent {
    pub lease: LeaseId,
    pub borrower: NodeId,
    pub borrower_addr: SocketAddr,
    pub request_id: u64,
    pub bytes: u64,
    pub credential: Credential,
    pub state: LentState,
    pub granted_us: u64,
    /// Last time the borrower listed it in a heartbeat (or ACKed it).
    pub reported_us: u64,
    pub pages_per_s: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BorrowedState {
    /// ACK sent, waiting for the donor's confirmation.
    Binding,
    Active,
    /// The donor asked for it back.
    Reclaimed {
        deadline_us: u64,
    },
}

/// A lease this node borrows, on behalf of a local owner (a process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Borrowed {
    pub owner: u64,
    pub donor: NodeId,
    pub donor_ctrl: SocketAddr,
    pub lease: LeaseId,
    pub request_id: u64,
    pub bytes: u64,
    pub data_addr: SocketAddr,
    pub credential: Credential,
    pub state: BorrowedState,
    /// When the demand's first request went out (for handshake latency).
    pub requested_us: u64,
    pub attempts: u32,
    pub next_send_us: u64,
    pub pages_per_s: u32,
    /// The demand's nodes to avoid, kept while binding: a donor that never
    /// confirms is asked for again under the same terms.
    pub avoid: Vec<NodeId>,
}

impl Borrowed {
    pub fn report(&self) -> LeaseReport {
        LeaseReport { donor: self.donor, lease_id: self.lease, pages_per_s: self.pages_per_s }
    }
}

/// A grant heard for a demand, kept until the choice is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantHeard {
    pub donor: NodeId,
    pub donor_ctrl: SocketAddr,
    pub grant: memlend_wire::ctrl::Grant,
    pub rtt_us: u32,
    pub arrival: u64,
}

/// A local owner's wish for memory, being negotiated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demand {
    pub owner: u64,
    pub request_id: u64,
    pub bytes: u64,
    pub bytes_min: u64,
    pub attempts: u32,
    /// First request sent (latency) and the latest (RTT of its grants).
    pub first_sent_us: u64,
    pub sent_us: u64,
    pub next_send_us: u64,
    /// Set when the first grant arrives: choose at this time.
    pub decide_us: Option<u64>,
    pub grants: Vec<GrantHeard>,
    /// Nodes not to lease from (`avoid.rs`), at most `AVOID_NODES_MAX`.
    pub avoid: Vec<NodeId>,
}

/// An offer heard from a server, valid until its next one is overdue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferHeard {
    pub donor: NodeId,
    pub donor_ctrl: SocketAddr,
    pub available_bytes: u64,
    pub valid_until_us: u64,
    pub arrival: u64,
}
