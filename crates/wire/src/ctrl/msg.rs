//! The control messages as Rust values. Every field that is a count or a size
//! says its unit; every list has an explicit maximum.

use std::net::SocketAddr;

/// Version 1 of the control protocol.
pub const CTRL_VERSION: u8 = 1;
/// Largest datagram we send or accept: fits a 1500-byte Ethernet MTU after
/// IPv6 (40 B) and UDP (8 B) headers, so nothing is ever fragmented.
pub const DATAGRAM_BYTES_MAX: usize = 1452;
/// Longest node name, in bytes of UTF-8.
pub const NAME_BYTES_MAX: usize = 32;
/// Most leases one heartbeat reports. A borrower node never holds more.
pub const HEARTBEAT_LEASES_MAX: usize = 48;
/// Longest failure-domain label, in bytes of UTF-8.
pub const DOMAIN_BYTES_MAX: usize = 32;
/// Header flag: the heartbeat ends with a failure-domain label. Only set
/// when the node has one, so a node without a domain speaks exactly the
/// first version of the protocol, and a peer that predates domains (which
/// refuses any flag) only misses the heartbeats of nodes that set one.
pub const FLAG_DOMAIN: u16 = 1;
/// Header flag: the heartbeat ends (after the domain label, if any) with a
/// few peers the sender knows ([`Heartbeat::peers`]). Only set by nodes
/// without broadcast (seed lists), where nothing else tells a node who else
/// exists.
pub const FLAG_PEERS: u16 = 2;
/// Most peers one heartbeat passes on: enough that membership spreads over
/// a thousand nodes in a few refresh rounds, small beside the datagram
/// (each is 8 bytes of id and at most 19 of address).
pub const HEARTBEAT_PEERS_MAX: usize = 8;

/// A node's id: stable across restarts of the same node (it is derived from
/// the node's name), so peers can tell a restart (same id, higher
/// incarnation) from a new node.
pub type NodeId = u64;
/// A lease's id, chosen by the donor; unique per donor incarnation.
pub type LeaseId = u64;
/// The secret a borrower presents on the data plane for one lease. It is the
/// page protocol's borrower id, so a borrower can only name the slabs of its
/// own leases.
pub type Credential = [u8; 16];

/// What a node currently is (ACMS section 4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NodeClass {
    /// Satisfied: neither lends nor borrows more.
    Neutral = 0,
    /// Has idle memory to lend.
    Server = 1,
    /// Needs memory.
    Client = 2,
}

/// Everything around a message: who sent it, in which cluster, and its
/// number. `(sender, incarnation, counter)` is unique: the receiver drops a
/// datagram it has seen, or one from an older incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub cluster_id: u64,
    pub sender: NodeId,
    /// Set once per daemon start (its start time in ns); increases across
    /// restarts of the same node.
    pub incarnation: u64,
    /// Increases by one per datagram sent in this incarnation, from 1.
    pub counter: u64,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Offer(Offer),
    Request(Request),
    Grant(Grant),
    Ack(Ack),
    Reclaim(Reclaim),
    Release(Release),
    Heartbeat(Heartbeat),
}

/// OFFERING_MEM: a server says how much it can lend (broadcast or unicast).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub available_bytes: u64,
    /// Where the page protocol is served.
    pub data_addr: SocketAddr,
    /// When the next offer will come, so a client knows when this one is stale.
    pub next_offer_ms: u32,
}

/// REQUESTING_MEM: a client asks for memory (broadcast, or unicast to the
/// servers it heard offers from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Chosen by the client; retransmissions reuse it.
    pub request_id: u64,
    pub bytes: u64,
    /// Smallest grant worth having; a server with less stays silent.
    pub bytes_min: u64,
}

/// GRANTING_MEM: a server reserves memory for one request. The grant binds
/// nothing until ACKed; unacknowledged, it expires after `ack_within_ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub request_id: u64,
    pub lease_id: LeaseId,
    pub bytes: u64,
    pub data_addr: SocketAddr,
    pub credential: Credential,
    pub ack_within_ms: u32,
}

/// ACK_MEM: the client binds exactly one grant (`confirm == false`); the
/// server answers every ACK with a confirming echo (`confirm == true`), so a
/// lost ACK is retransmitted and a duplicate is harmless.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub request_id: u64,
    pub lease_id: LeaseId,
    pub confirm: bool,
}

/// RECLAIM_MEM: the donor wants a lease back; the borrower moves its pages
/// elsewhere and RELEASEs before the deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaim {
    pub lease_id: LeaseId,
    pub bytes: u64,
    pub deadline_ms: u32,
}

/// Why a lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReleaseReason {
    /// Borrower to donor: the pages are gone (moved away or no longer needed).
    Done = 0,
    /// Donor to borrower: the donor dropped the lease (reclaim deadline
    /// passed, or the grant was never acknowledged).
    Revoked = 1,
    /// Donor to borrower: it does not know this lease (answer to an ACK or a
    /// heartbeat for a lease it never had or already freed).
    Unknown = 2,
}

/// RELEASE: a lease ends. Either side sends it; the receiver answers a
/// borrower's RELEASE with nothing (it is idempotent) and retransmission
/// stops when the lease no longer appears in heartbeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub lease_id: LeaseId,
    pub reason: ReleaseReason,
}

/// One lease as its borrower reports it in a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseReport {
    pub donor: NodeId,
    pub lease_id: LeaseId,
    /// Pages read or written on this lease per second, smoothed: the donor
    /// reclaims the least active first.
    pub pages_per_s: u32,
}

/// HEARTBEAT: liveness and state. Every heartbeat period a node sends one
/// to each lease partner, carrying the leases that partner lends it (which
/// keeps them alive at their donor); to the whole cluster it goes with no
/// leases, as a summary, on a change that matters or a slow refresh
/// (`memlend_pool::engine`'s `summary.rs`). Same encoding either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub name: String,
    pub class: NodeClass,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub lent_bytes: u64,
    pub borrowed_bytes: u64,
    /// What it could grant now (0 unless a server with room).
    pub available_bytes: u64,
    /// Where this node's page protocol is served (0.0.0.0:0 if it lends none).
    pub data_addr: SocketAddr,
    /// At most [`HEARTBEAT_LEASES_MAX`].
    pub leases: Vec<LeaseReport>,
    /// The failure domain it sits in (a rack, a zone; at most
    /// [`DOMAIN_BYTES_MAX`]); empty when it has none. A mirror's copies go to
    /// different domains when the cluster has them.
    pub domain: String,
    /// Peers the sender knows, passed on so membership spreads without
    /// broadcast (at most [`HEARTBEAT_PEERS_MAX`]); empty on a LAN.
    pub peers: Vec<PeerAddr>,
}

/// A peer as gossip passes it on: who, and where its control plane listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr {
    pub node: NodeId,
    pub ctrl_addr: SocketAddr,
}
