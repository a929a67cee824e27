//! The borrower's side: turn local demand into requests, choose one grant per
//! request (ACK binds exactly one; the others are released at once and would
//! expire anyway), keep leases alive, hand reclaims to their owners.

use super::avoid::Fit;
use super::types::{Demand, GrantHeard, OfferHeard};
use super::{Borrowed, BorrowedState, Dest, Engine, Event, Output, MS};
use crate::select::Candidate;
use memlend_wire::ctrl::{
    Ack, Body, Grant, LeaseId, NodeId, Offer, Reclaim, Release, ReleaseReason, Request,
};
use std::net::SocketAddr;

/// The most one `want` may ask for: far beyond any node's memory, and far
/// from overflowing when rounded up to the grant unit.
pub const WANT_BYTES_MAX: u64 = 1 << 50;

impl Engine {
    /// A local owner (a process) wants `bytes` more. The answer comes as
    /// `LeaseReady` events (maybe several, if donors grant in parts) or
    /// `DemandUnmet`.
    pub fn want(&mut self, now_us: u64, owner: u64, bytes: u64) {
        self.want_avoiding(now_us, owner, bytes, &[]);
    }

    /// As [`want`](Engine::want), from donors other than `avoid` (at most
    /// [`AVOID_NODES_MAX`](super::AVOID_NODES_MAX)) and, where the cluster
    /// allows, outside their failure domains (`avoid.rs`): the other copy
    /// of a mirror's pages lives there.
    pub fn want_avoiding(&mut self, now_us: u64, owner: u64, bytes: u64, avoid: &[NodeId]) {
        self.advance(now_us);
        assert!(avoid.len() <= super::AVOID_NODES_MAX, "callers check AVOID_NODES_MAX");
        let unit = self.cfg.grant_unit_bytes.max(1);
        assert!(bytes <= WANT_BYTES_MAX, "callers check WANT_BYTES_MAX");
        let bytes = bytes.div_ceil(unit) * unit;
        if bytes == 0 {
            return;
        }
        // No live peer is a server (heartbeats say so every 500 ms): say so
        // now rather than after every retry, so a reclaimed lease goes home
        // at once.
        let no_server = self.members.count(memlend_wire::ctrl::NodeClass::Server) == 0;
        if self.demands.len() >= self.cfg.demands_max || no_server {
            self.metrics.demands_unmet += 1;
            self.push(Output::Event(Event::DemandUnmet { owner, bytes }));
            return;
        }
        self.new_demand(owner, bytes, self.now_us, avoid.to_vec());
    }

    fn new_demand(&mut self, owner: u64, bytes: u64, first_sent_us: u64, avoid: Vec<NodeId>) {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let d = Demand {
            owner,
            request_id,
            bytes,
            bytes_min: self.cfg.grant_unit_bytes.min(bytes),
            attempts: 0,
            first_sent_us,
            sent_us: self.now_us,
            next_send_us: self.now_us,
            decide_us: None,
            grants: Vec::new(),
            avoid,
        };
        self.demands.insert(request_id, d);
        self.send_request(request_id);
    }

    /// Unicast to the chosen offerer when servers broadcast and one has
    /// room; else to the few servers the selector likes best among those
    /// whose heartbeats say they have room (`request_dests`).
    fn send_request(&mut self, request_id: u64) {
        let Some(d) = self.demands.get(&request_id) else { return };
        let r = Request { request_id, bytes: d.bytes, bytes_min: d.bytes_min };
        let (bytes_min, attempts, avoid, owner) =
            (d.bytes_min, d.attempts, d.avoid.clone(), d.owner);
        let dests = match self.pick_offer(owner, bytes_min, &avoid) {
            Some(to) if self.servers_broadcast() => vec![Dest::To(to)],
            _ => self.request_dests(request_id, owner, bytes_min, attempts, &avoid),
        };
        let d = self.demands.get_mut(&request_id).expect("checked above");
        d.sent_us = self.now_us;
        d.next_send_us = self.now_us + self.cfg.retry_us(d.attempts);
        d.attempts += 1;
        for to in dests {
            self.send(to, Body::Request(r.clone()));
        }
    }

    /// Where a request goes (ACMS's 3-way handshake): `request_fanout`
    /// servers with room by their last heartbeat, doubling with each
    /// attempt, chosen by the selector. Every server with room answers a
    /// broadcast with a grant for the whole amount and all but one are
    /// released: at 1000 nodes a broadcast request drew about 510 grants,
    /// and grants and releases were 88% of the control bytes (docs/scale.md).
    /// A broadcast still goes out when no server is known to have room, or
    /// when the fan-out would reach them all. "Arrival order" here is a
    /// hash of this node, the request and the server: with `first`,
    /// borrowers asking at once spread over the servers instead of all
    /// asking the same three (the lowest ids), which left 8.9 GiB unmet at
    /// the end of a 300-node run.
    /// A demand that avoids nodes asks only servers it may take (a
    /// broadcast would draw grants from the avoided ones too; they are
    /// released when chosen among).
    fn request_dests(
        &mut self,
        request_id: u64,
        owner: u64,
        bytes_min: u64,
        attempts: u32,
        avoid: &[NodeId],
    ) -> Vec<Dest> {
        use memlend_wire::ctrl::NodeClass;
        let fanout = self.cfg.request_fanout.checked_shl(attempts.min(16)).unwrap_or(usize::MAX);
        let mut cands: Vec<(Candidate, SocketAddr)> = self
            .members
            .iter()
            .filter(|p| {
                p.class == NodeClass::Server && !p.suspect && p.available_bytes >= bytes_min
            })
            .enumerate()
            .map(|(i, p)| {
                let c = Candidate {
                    node: p.node,
                    available_bytes: p.available_bytes,
                    rtt_us: self.rtt_us.get(&p.node).copied(),
                    arrival_order: spread(self.cfg.node, request_id, p.node, i),
                };
                (c, p.ctrl_addr)
            })
            .collect();
        if !avoid.is_empty() {
            let nodes: Vec<NodeId> = cands.iter().map(|(c, _)| c.node).collect();
            let usable = self.usable(owner, avoid, &nodes);
            if !usable.is_empty() {
                cands = usable.into_iter().map(|i| cands[i]).collect();
                if fanout >= cands.len() {
                    // All of them, but only them: a broadcast would draw
                    // the first grant from an avoided domain.
                    return cands.into_iter().map(|(_, to)| Dest::To(to)).collect();
                }
            }
        }
        if cands.is_empty() || fanout >= cands.len() {
            return self.heartbeat_dests();
        }
        let mut dests = Vec::with_capacity(fanout);
        // Each turn removes a candidate, so the candidates bound the loop.
        while dests.len() < fanout {
            let now: Vec<Candidate> = cands.iter().map(|(c, _)| *c).collect();
            let Some(i) = self.selector.pick(&now) else { break };
            dests.push(Dest::To(cands.swap_remove(i).1));
        }
        dests
    }

    fn pick_offer(&mut self, owner: u64, bytes_min: u64, avoid: &[NodeId]) -> Option<SocketAddr> {
        let now = self.now_us;
        let mut fresh: Vec<&OfferHeard> = self
            .offers
            .values()
            .filter(|o| o.valid_until_us > now && o.available_bytes >= bytes_min)
            .collect();
        if !avoid.is_empty() {
            let nodes: Vec<NodeId> = fresh.iter().map(|o| o.donor).collect();
            fresh = self.usable(owner, avoid, &nodes).into_iter().map(|i| fresh[i]).collect();
        }
        let cands: Vec<Candidate> = fresh
            .iter()
            .map(|o| Candidate {
                node: o.donor,
                available_bytes: o.available_bytes,
                rtt_us: self.rtt_us.get(&o.donor).copied(),
                arrival_order: o.arrival,
            })
            .collect();
        let i = self.selector.pick(&cands)?;
        Some(fresh[i].donor_ctrl)
    }

    pub(super) fn on_offer(&mut self, donor: NodeId, from: SocketAddr, o: &Offer) {
        // Valid until twice the announced period has passed without another.
        let valid_us = u64::from(o.next_offer_ms).max(100) * 2 * MS;
        self.arrivals += 1;
        let heard = OfferHeard {
            donor,
            donor_ctrl: from,
            available_bytes: o.available_bytes,
            valid_until_us: self.now_us + valid_us,
            arrival: self.arrivals,
        };
        self.offers.insert(donor, heard);
    }

    pub(super) fn on_grant(&mut self, donor: NodeId, from: SocketAddr, g: Grant) {
        let Some(d) = self.demands.get_mut(&g.request_id) else {
            // Not wanted (already chosen, or given up): let it go now
            // rather than at its expiry. Idempotent at the donor.
            if !self.borrowed.contains_key(&(donor, g.lease_id)) {
                self.release_to(from, g.lease_id);
            }
            return;
        };
        if d.grants.iter().any(|h| h.donor == donor) {
            return; // a duplicate
        }
        if d.avoid.contains(&donor) {
            // It holds the other copy: a broadcast request reached it too.
            self.release_to(from, g.lease_id);
            return;
        }
        // A grant from an avoided domain waits the window even under
        // first-come: a grant from elsewhere may follow.
        let (avoid, owner) = (std::mem::take(&mut d.avoid), d.owner);
        let apart = avoid.is_empty() || self.fit(owner, &avoid, donor) <= Fit::Apart;
        let d = self.demands.get_mut(&g.request_id).expect("looked up above");
        d.avoid = avoid;
        let rtt_us = self.now_us.saturating_sub(d.sent_us).min(u64::from(u32::MAX)) as u32;
        self.rtt_us.insert(donor, rtt_us);
        self.arrivals += 1;
        d.grants.push(GrantHeard {
            donor,
            donor_ctrl: from,
            grant: g,
            rtt_us,
            arrival: self.arrivals,
        });
        if d.decide_us.is_none() {
            let waits = self.selector.waits_for_more() || !apart;
            let window_ms = if waits { self.cfg.grant_window_ms } else { 0 };
            d.decide_us = Some(self.now_us + window_ms * MS);
        }
    }

    /// Choose one grant for the demand: ACK it, release the others.
    fn decide(&mut self, request_id: u64) {
        let Some(mut d) = self.demands.remove(&request_id) else { return };
        // Grants outside the avoided domains when there are any (`avoid.rs`).
        let nodes: Vec<NodeId> = d.grants.iter().map(|h| h.donor).collect();
        let usable = self.usable(d.owner, &d.avoid, &nodes);
        let usable = self.preferred(d.owner, &d.avoid, &nodes, usable);
        let mut set_aside = Vec::new();
        for i in (0..d.grants.len()).rev() {
            if !usable.contains(&i) {
                set_aside.push(d.grants.swap_remove(i));
            }
        }
        for h in set_aside {
            self.release_to(h.donor_ctrl, h.grant.lease_id);
        }
        if d.grants.is_empty() {
            // Its grants' donors died while it waited (`lose_borrowed_from`):
            // back to asking, on the retry timer it had.
            d.decide_us = None;
            self.demands.insert(request_id, d);
            return;
        }
        let cands: Vec<Candidate> = d
            .grants
            .iter()
            .map(|h| Candidate {
                node: h.donor,
                available_bytes: h.grant.bytes,
                rtt_us: Some(h.rtt_us),
                arrival_order: h.arrival,
            })
            .collect();
        let chosen = self.selector.pick(&cands).unwrap_or(0);
        let h = d.grants.swap_remove(chosen);
        for other in d.grants.drain(..) {
            self.release_to(other.donor_ctrl, other.grant.lease_id);
        }
        if self.borrowed.len() >= self.cfg.borrowed_max {
            self.release_to(h.donor_ctrl, h.grant.lease_id);
            self.metrics.demands_unmet += 1;
            self.push(Output::Event(Event::DemandUnmet { owner: d.owner, bytes: d.bytes }));
            return;
        }
        let bytes = h.grant.bytes.min(d.bytes);
        self.bind(&d, h);
        if bytes < d.bytes {
            let avoid = d.avoid.clone();
            self.new_demand(d.owner, d.bytes - bytes, d.first_sent_us, avoid);
        }
    }

    fn bind(&mut self, d: &Demand, h: GrantHeard) {
        let b = Borrowed {
            owner: d.owner,
            donor: h.donor,
            donor_ctrl: h.donor_ctrl,
            lease: h.grant.lease_id,
            request_id: d.request_id,
            bytes: h.grant.bytes,
            data_addr: h.grant.data_addr,
            credential: h.grant.credential,
            state: BorrowedState::Binding,
            requested_us: d.first_sent_us,
            attempts: 0,
            next_send_us: self.now_us,
            pages_per_s: 0,
            avoid: d.avoid.clone(),
        };
        self.borrowed.insert((h.donor, h.grant.lease_id), b);
        self.send_ack(h.donor, h.grant.lease_id);
    }

    fn send_ack(&mut self, donor: NodeId, lease: LeaseId) {
        let next_us = self.now_us;
        let Some(b) = self.borrowed.get_mut(&(donor, lease)) else { return };
        b.next_send_us = next_us + self.cfg.retry_us(b.attempts);
        b.attempts += 1;
        let a = Ack { request_id: b.request_id, lease_id: lease, confirm: false };
        let to = b.donor_ctrl;
        self.send(Dest::To(to), Body::Ack(a));
    }

    pub(super) fn on_confirm(&mut self, donor: NodeId, a: &Ack) {
        let Some(b) = self.borrowed.get_mut(&(donor, a.lease_id)) else {
            // Bound after we gave up on it (our RELEASE was lost): free it
            // now rather than when the donor finds it stranded.
            if let Some(to) = self.members.get(donor).map(|p| p.ctrl_addr) {
                self.release_to(to, a.lease_id);
            }
            return;
        };
        if b.state != BorrowedState::Binding {
            return; // a duplicate confirmation
        }
        b.state = BorrowedState::Active;
        let lease = b.clone();
        self.metrics.handshake(self.now_us.saturating_sub(lease.requested_us));
        self.push(Output::Event(Event::LeaseReady { owner: lease.owner, lease }));
    }

    pub(super) fn on_reclaim(&mut self, donor: NodeId, r: &Reclaim) {
        let deadline_us = self.now_us + u64::from(r.deadline_ms) * MS;
        let Some(b) = self.borrowed.get_mut(&(donor, r.lease_id)) else {
            let to = self.members.get(donor).map(|p| p.ctrl_addr);
            if let Some(to) = to {
                self.release_to(to, r.lease_id); // we hold nothing there
            }
            return;
        };
        if b.state != BorrowedState::Active {
            return; // binding (the confirm will follow) or already reclaimed
        }
        b.state = BorrowedState::Reclaimed { deadline_us };
        let (owner, lease) = (b.owner, b.lease);
        self.push(Output::Event(Event::ReclaimRequested { owner, donor, lease, deadline_us }));
    }

    pub(super) fn on_release(&mut self, sender: NodeId, r: &Release) {
        match r.reason {
            ReleaseReason::Done => self.on_release_lent(sender, r.lease_id),
            ReleaseReason::Revoked | ReleaseReason::Unknown => {
                let Some(b) = self.borrowed.remove(&(sender, r.lease_id)) else { return };
                if b.state == BorrowedState::Binding {
                    // Never bound: not lost, just ask again.
                    self.new_demand(b.owner, b.bytes, b.requested_us, b.avoid);
                    return;
                }
                self.metrics.leases_lost += 1;
                let why = if r.reason == ReleaseReason::Revoked {
                    "revoked by donor"
                } else {
                    "unknown to donor"
                };
                self.push(Output::Event(Event::LeaseLost {
                    owner: b.owner,
                    donor: sender,
                    lease: b.lease,
                    why,
                }));
            }
        }
    }

    /// `owner` is done with one of its leases; another owner's lease is
    /// left alone (false).
    pub fn release_owned(
        &mut self,
        now_us: u64,
        owner: u64,
        donor: NodeId,
        lease: LeaseId,
    ) -> bool {
        if self.borrowed.get(&(donor, lease)).is_none_or(|b| b.owner != owner) {
            return false;
        }
        self.release(now_us, donor, lease);
        true
    }

    /// The owner is done with a lease (its pages moved away or freed).
    pub fn release(&mut self, now_us: u64, donor: NodeId, lease: LeaseId) {
        self.advance(now_us);
        if let Some(b) = self.borrowed.remove(&(donor, lease)) {
            if matches!(b.state, BorrowedState::Reclaimed { .. }) {
                self.metrics.migrations += 1;
            }
            self.release_to(b.donor_ctrl, lease);
        }
    }

    /// The owner went away: release all it holds, forget what it wanted.
    pub fn drop_owner(&mut self, now_us: u64, owner: u64) {
        self.advance(now_us);
        self.demands.retain(|_, d| d.owner != owner);
        let mine: Vec<(NodeId, LeaseId)> = self
            .borrowed
            .values()
            .filter(|b| b.owner == owner)
            .map(|b| (b.donor, b.lease))
            .collect();
        for (donor, lease) in mine {
            self.release(now_us, donor, lease);
        }
    }

    /// Activity the owner measured on one of its leases, reported to its
    /// donor.
    pub fn set_activity(&mut self, owner: u64, donor: NodeId, lease: LeaseId, pages_per_s: u32) {
        if let Some(b) = self.borrowed.get_mut(&(donor, lease)).filter(|b| b.owner == owner) {
            b.pages_per_s = pages_per_s;
        }
    }

    /// A live server, not avoided, whose last heartbeat offered at least
    /// `bytes`.
    fn some_server_has(&self, bytes: u64, avoid: &[NodeId]) -> bool {
        use memlend_wire::ctrl::NodeClass;
        self.members.iter().any(|p| {
            p.class == NodeClass::Server
                && !p.suspect
                && p.available_bytes >= bytes
                && !avoid.contains(&p.node)
        })
    }

    /// Bytes wanted and not yet granted: the classifier's "unmet demand".
    pub fn unmet_demand_bytes(&self) -> u64 {
        self.demands.values().map(|d| d.bytes).sum()
    }

    /// The same for one local owner.
    pub fn unmet_demand_bytes_of(&self, owner: u64) -> u64 {
        self.demands.values().filter(|d| d.owner == owner).map(|d| d.bytes).sum()
    }

    fn release_to(&mut self, to: SocketAddr, lease: LeaseId) {
        let r = Release { lease_id: lease, reason: ReleaseReason::Done };
        self.send(Dest::To(to), Body::Release(r));
    }

    pub(super) fn lose_borrowed_from(&mut self, donor: NodeId, why: &'static str) {
        self.offers.remove(&donor);
        for d in self.demands.values_mut() {
            d.grants.retain(|h| h.donor != donor);
        }
        let gone: Vec<LeaseId> =
            self.borrowed.values().filter(|b| b.donor == donor).map(|b| b.lease).collect();
        for lease in gone {
            let b = self.borrowed.remove(&(donor, lease)).expect("listed above");
            if b.state == BorrowedState::Binding {
                self.new_demand(b.owner, b.bytes, b.requested_us, b.avoid);
                continue;
            }
            self.metrics.leases_lost += 1;
            self.push(Output::Event(Event::LeaseLost { owner: b.owner, donor, lease, why }));
        }
    }

    pub(super) fn borrower_timers(&mut self) {
        let now = self.now_us;
        let ids: Vec<u64> = self.demands.keys().copied().collect();
        for id in ids {
            let d = &self.demands[&id];
            if d.decide_us.is_some_and(|t| now >= t) {
                self.decide(id);
            } else if d.decide_us.is_none() && now >= d.next_send_us {
                // Retransmit while some server says it has room (the first
                // request went anyway, in case a heartbeat was stale).
                let hopeless = !self.some_server_has(d.bytes_min, &d.avoid);
                if d.attempts >= self.cfg.retry_attempts || hopeless {
                    let d = self.demands.remove(&id).expect("listed above");
                    self.metrics.demands_unmet += 1;
                    self.push(Output::Event(Event::DemandUnmet { owner: d.owner, bytes: d.bytes }));
                } else {
                    self.send_request(id);
                }
            }
        }
        self.ack_timers();
    }

    fn ack_timers(&mut self) {
        let now = self.now_us;
        let due: Vec<(NodeId, LeaseId, u32)> = self
            .borrowed
            .values()
            .filter(|b| b.state == BorrowedState::Binding && now >= b.next_send_us)
            .map(|b| (b.donor, b.lease, b.attempts))
            .collect();
        for (donor, lease, attempts) in due {
            if attempts < self.cfg.retry_attempts {
                self.send_ack(donor, lease);
                continue;
            }
            // The donor never confirmed: give it back and ask again.
            let b = self.borrowed.remove(&(donor, lease)).expect("listed above");
            self.release_to(b.donor_ctrl, lease);
            self.metrics.demands_unmet += 1;
            self.push(Output::Event(Event::DemandUnmet { owner: b.owner, bytes: b.bytes }));
        }
    }

    pub(super) fn borrower_deadline_us(&self) -> u64 {
        let d = self.demands.values().map(|d| d.decide_us.unwrap_or(d.next_send_us));
        let b = self
            .borrowed
            .values()
            .filter(|b| b.state == BorrowedState::Binding)
            .map(|b| b.next_send_us);
        d.chain(b).min().unwrap_or(u64::MAX)
    }
}

/// A well-mixed 64-bit number from a borrower, a request and a server
/// (SplitMix64's finalizer over their combination), ties broken by `i`.
fn spread(borrower: NodeId, request_id: u64, server: NodeId, i: usize) -> u64 {
    let mut x = borrower ^ request_id.rotate_left(21) ^ server.rotate_left(42);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) & !0xffff | i as u64 & 0xffff
}
