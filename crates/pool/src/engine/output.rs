//! What the engine asks of the daemon.

use super::types::Borrowed;
use memlend_wire::ctrl::{Body, Credential, LeaseId, NodeClass, NodeId};
use std::net::SocketAddr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    Broadcast,
    To(SocketAddr),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Send { to: Dest, body: Body },
    Event(Event),
}

/// Things the daemon acts on. Donor events change what the data plane
/// accepts; borrower events go to the local process that owns the demand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Donor: let `credential` open slabs of up to `bytes` (before the grant
    /// is sent, so a borrower can never be refused memory it was granted).
    Reserve {
        lease: LeaseId,
        credential: Credential,
        bytes: u64,
    },
    /// Donor: the lease is over; free its slabs.
    Unreserve {
        lease: LeaseId,
        credential: Credential,
        why: &'static str,
    },
    /// Borrower: a lease is bound and confirmed; hand it to its owner.
    LeaseReady {
        owner: u64,
        lease: Borrowed,
    },
    /// Borrower: the owner could not be given `bytes` (no donor has room).
    DemandUnmet {
        owner: u64,
        bytes: u64,
    },
    /// Borrower: the donor wants this lease back by the deadline.
    ReclaimRequested {
        owner: u64,
        donor: NodeId,
        lease: LeaseId,
        deadline_us: u64,
    },
    /// Borrower: the lease is gone (donor died, restarted or revoked it).
    LeaseLost {
        owner: u64,
        donor: NodeId,
        lease: LeaseId,
        why: &'static str,
    },
    PeerJoined {
        node: NodeId,
    },
    PeerLost {
        node: NodeId,
    },
    ClassChanged {
        from: NodeClass,
        to: NodeClass,
    },
}
