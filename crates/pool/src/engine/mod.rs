//! The ACMS protocol engine: a pure state machine. The daemon feeds it
//! datagrams (already authenticated and checked against replay), the node's
//! classification, local demand and the time; it answers with datagrams to
//! send and events for the data plane. No sockets, no clocks, no threads:
//! that is what lets `tests/model.rs` explore every interleaving of loss,
//! duplication and reordering.
//!
//! The two sides live in `donor.rs` (grants, reclaim) and `borrower.rs`
//! (requests, leases). A node can be both at once: it may still lend old
//! leases while it borrows. `heartbeat.rs` keeps lease partners in touch
//! every heartbeat and decides failure; `summary.rs` decides when the whole
//! cluster hears of a node (when it newly has room or stops being a server,
//! else on a refresh that slows as the cluster grows), so what a node
//! receives does not grow with N.

mod avoid;
mod borrower;
mod config;
mod donor;
mod gossip;
mod heartbeat;
mod metrics;
mod output;
mod summary;
mod types;

pub use avoid::AVOID_NODES_MAX;
pub use borrower::WANT_BYTES_MAX;
pub use config::{Config, MS};
pub use metrics::{kind, Metrics, KINDS};
pub use output::{Dest, Event, Output};
pub use types::{Borrowed, BorrowedState, Demand, Lent, LentState, Status};

use crate::members::{Heard, Members};
use crate::select::Selector;
use memlend_wire::ctrl::{Body, Heartbeat, LeaseId, NodeClass, NodeId};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

/// Most outputs queued between two drains. The daemon drains after every
/// call, so reaching this is a bug; it is asserted.
const OUTPUTS_MAX: usize = 4096;

/// Clone: the model checker forks the whole engine at every choice.
pub struct Engine {
    cfg: Config,
    now_us: u64,
    status: Status,
    members: Members,
    selector: Box<dyn Selector + Send>,
    // Donor side.
    lent: BTreeMap<LeaseId, Lent>,
    next_lease_id: LeaseId,
    next_offer_us: u64,
    offer_period_us: u64,
    last_offer_bytes: u64,
    // Borrower side.
    demands: BTreeMap<u64, Demand>,
    next_request_id: u64,
    offers: BTreeMap<NodeId, types::OfferHeard>,
    /// Latest measured request-to-grant time per donor (for "nearest").
    rtt_us: BTreeMap<NodeId, u32>,
    arrivals: u64,
    borrowed: BTreeMap<(NodeId, LeaseId), Borrowed>,
    next_heartbeat_us: u64,
    summary: summary::Summary,
    rumors: gossip::Rumors,
    out: VecDeque<Output>,
    metrics: Metrics,
}

impl Clone for Engine {
    fn clone(&self) -> Engine {
        Engine {
            cfg: self.cfg.clone(),
            now_us: self.now_us,
            status: self.status,
            members: self.members.clone(),
            selector: self.selector.clone_box(),
            lent: self.lent.clone(),
            next_lease_id: self.next_lease_id,
            next_offer_us: self.next_offer_us,
            offer_period_us: self.offer_period_us,
            last_offer_bytes: self.last_offer_bytes,
            demands: self.demands.clone(),
            next_request_id: self.next_request_id,
            offers: self.offers.clone(),
            rtt_us: self.rtt_us.clone(),
            arrivals: self.arrivals,
            borrowed: self.borrowed.clone(),
            next_heartbeat_us: self.next_heartbeat_us,
            summary: self.summary.clone(),
            rumors: self.rumors.clone(),
            out: self.out.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl Engine {
    pub fn new(cfg: Config, selector: Box<dyn Selector + Send>) -> Engine {
        Engine {
            status: Status::default(),
            members: Members::default(),
            selector,
            lent: BTreeMap::new(),
            next_lease_id: 1,
            next_offer_us: 0,
            offer_period_us: cfg.offer_min_ms * MS,
            last_offer_bytes: 0,
            demands: BTreeMap::new(),
            next_request_id: 1,
            offers: BTreeMap::new(),
            rtt_us: BTreeMap::new(),
            arrivals: 0,
            borrowed: BTreeMap::new(),
            next_heartbeat_us: 0,
            summary: summary::Summary::default(),
            rumors: gossip::Rumors::default(),
            out: VecDeque::new(),
            metrics: Metrics::default(),
            now_us: 0,
            cfg,
        }
    }

    /// The node's classification and memory, from the monitor.
    pub fn set_status(&mut self, now_us: u64, status: Status) {
        self.advance(now_us);
        let was = self.status.class;
        self.status = status;
        if was != status.class {
            self.metrics.class_changes += 1;
            self.push(Output::Event(Event::ClassChanged { from: was, to: status.class }));
            self.offer_period_us = self.cfg.offer_min_ms * MS;
            self.next_offer_us = now_us;
        }
        self.reclaim_if_needed();
        self.summary_if_due();
    }

    /// A datagram from `from`, already authenticated, from this cluster, and
    /// not a replay.
    pub fn on_message(
        &mut self,
        now_us: u64,
        from: SocketAddr,
        sender: NodeId,
        incarnation: u64,
        body: Body,
    ) {
        self.advance(now_us);
        if sender == self.cfg.node {
            return; // our own broadcast, looped back
        }
        self.metrics.received(&body);
        let mut heard = self.members.touch(sender, incarnation, from, now_us);
        if heard == Heard::Refused && self.worth_a_place(&body) {
            let partners = self.partners();
            let unit = self.cfg.grant_unit_bytes.max(1);
            let keep = |p: &crate::members::Peer| {
                partners.contains_key(&p.node)
                    || (p.class == NodeClass::Server && p.available_bytes >= unit && !p.suspect)
            };
            if self.members.forget_one(keep).is_some() {
                heard = self.members.touch(sender, incarnation, from, now_us);
            }
        }
        match heard {
            Heard::Stale | Heard::Refused => return,
            Heard::Restarted => {
                self.peer_gone(sender, "restarted");
                self.tell(sender, true);
            }
            Heard::Joined => {
                self.push(Output::Event(Event::PeerJoined { node: sender }));
                self.tell(sender, true);
            }
            Heard::Known => {}
        }
        match body {
            Body::Heartbeat(hb) => self.on_heartbeat(sender, &hb),
            Body::Offer(o) => self.on_offer(sender, from, &o),
            Body::Request(r) => self.on_request(sender, from, &r),
            Body::Grant(g) => self.on_grant(sender, from, g),
            Body::Ack(a) if a.confirm => self.on_confirm(sender, &a),
            Body::Ack(a) => self.on_ack(sender, from, &a),
            Body::Reclaim(r) => self.on_reclaim(sender, &r),
            Body::Release(r) => self.on_release(sender, &r),
        }
        self.summary_if_due(); // a grant or a release may change the room
    }

    /// Run every timer due at `now_us`: retransmissions, expiries,
    /// heartbeats, summaries, offers, failure detection.
    pub fn tick(&mut self, now_us: u64) {
        self.advance(now_us);
        self.expire_members();
        self.donor_timers();
        self.borrower_timers();
        self.heartbeat_timer();
        self.summary_if_due();
    }

    /// The earliest time `tick` has something to do (for the daemon's poll).
    pub fn next_deadline_us(&self) -> u64 {
        let mut t = self.now_us + self.cfg.suspect_ms.min(1_000) * MS;
        if self.cfg.heartbeat_ms > 0 {
            t = t.min(self.next_heartbeat_us);
        }
        t = t.min(self.donor_deadline_us()).min(self.borrower_deadline_us());
        t.max(self.now_us)
    }

    /// The next thing to send or report, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    pub fn members(&self) -> &Members {
        &self.members
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn lent(&self) -> impl Iterator<Item = &Lent> {
        self.lent.values()
    }

    pub fn borrowed(&self) -> impl Iterator<Item = &Borrowed> {
        self.borrowed.values()
    }

    pub fn demands(&self) -> impl Iterator<Item = &Demand> {
        self.demands.values()
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    fn advance(&mut self, now_us: u64) {
        // Time never runs backwards for the engine, whatever the caller does.
        self.now_us = self.now_us.max(now_us);
    }

    fn push(&mut self, o: Output) {
        assert!(self.out.len() < OUTPUTS_MAX, "engine outputs not drained");
        if let Output::Send { body, .. } = &o {
            self.metrics.sent(body);
        }
        self.out.push_back(o);
    }

    fn send(&mut self, to: Dest, body: Body) {
        self.push(Output::Send { to, body });
    }

    fn on_heartbeat(&mut self, sender: NodeId, hb: &Heartbeat) {
        self.members.update(sender, hb);
        self.no_rumor(sender);
        self.donor_heard_reports(sender, hb);
        self.heard_of(&hb.peers);
    }

    /// Whether a peer the full member table refused should take a place:
    /// a server with room (what borrowers need to know), or any message of
    /// a handshake or lease (dropping those would stall a lease). A
    /// heartbeat of any other peer waits for a place.
    fn worth_a_place(&self, body: &Body) -> bool {
        match body {
            Body::Heartbeat(hb) => {
                hb.class == NodeClass::Server
                    && hb.available_bytes >= self.cfg.grant_unit_bytes.max(1)
            }
            _ => true,
        }
    }

    /// A peer restarted or went silent: drop what it lent us and what we
    /// lent it.
    fn peer_gone(&mut self, node: NodeId, why: &'static str) {
        self.revoke_lent_to(node, why);
        self.lose_borrowed_from(node, why);
    }

    pub fn lent_bytes(&self) -> u64 {
        self.lent.values().map(|l| l.bytes).sum()
    }

    pub fn borrowed_bytes(&self) -> u64 {
        self.borrowed.values().filter(|b| b.state != BorrowedState::Binding).map(|b| b.bytes).sum()
    }

    /// Whichever group is smaller broadcasts (ACMS 4.3): servers offer when
    /// they are no more numerous than the clients.
    fn servers_broadcast(&self) -> bool {
        let mut servers = self.members.count(NodeClass::Server);
        let mut clients = self.members.count(NodeClass::Client);
        match self.status.class {
            NodeClass::Server => servers += 1,
            NodeClass::Client => clients += 1,
            NodeClass::Neutral => {}
        }
        clients > 0 && servers <= clients
    }
}
