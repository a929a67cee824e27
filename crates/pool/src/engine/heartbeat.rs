//! Heartbeats: every `heartbeat_ms` a node unicasts one to each lease
//! partner (each donor it borrows from, each borrower it lends to), carrying
//! only the leases that partner lends, so a lease's two ends detect each
//! other's death within `dead_ms` and the donor hears activity for its
//! reclaim order. Summaries to the whole cluster (the same message, with no
//! leases) follow `summary.rs`: on a change that matters, else slowly.
//!
//! Failure detection follows the same split: a partner silent for
//! `suspect_ms`/`dead_ms` is suspect/gone (its leases revoked or lost); any
//! other peer only after several of its refresh periods
//! (`summary::far_timeouts_us`).

use super::summary::{far_timeouts_us, refresh_us};
use super::{BorrowedState, Dest, Engine, Event, Output, MS};
use memlend_wire::ctrl::{Body, Heartbeat, NodeClass, NodeId, HEARTBEAT_LEASES_MAX};
use std::collections::BTreeMap;
use std::net::SocketAddr;

impl Engine {
    /// Lease partners and where they listen. Bounded by the lease tables
    /// (`lent_max` + `borrowed_max`).
    pub fn partners(&self) -> BTreeMap<NodeId, SocketAddr> {
        let mut p: BTreeMap<NodeId, SocketAddr> =
            self.borrowed.values().map(|b| (b.donor, b.donor_ctrl)).collect();
        for l in self.lent.values() {
            p.entry(l.borrower).or_insert(l.borrower_addr);
        }
        p
    }

    /// The heartbeat timer: one to each partner. (Summaries: `tick` asks
    /// after every timer, so a refresh is at most a heartbeat late.)
    pub(super) fn heartbeat_timer(&mut self) {
        if self.cfg.heartbeat_ms == 0 || self.now_us < self.next_heartbeat_us {
            return;
        }
        self.next_heartbeat_us = self.now_us + self.cfg.heartbeat_ms * MS;
        for (node, addr) in self.partners() {
            let hb = self.heartbeat_for(Some(node));
            self.send(Dest::To(addr), Body::Heartbeat(hb));
        }
    }

    /// A summary to the whole cluster if it newly has room or stopped
    /// being a server, or its refresh is due (`summary.rs`). Called after
    /// every input: a grant or a release changes the room.
    pub(super) fn summary_if_due(&mut self) {
        let (server, room) = self.summary_state();
        let period_us = self.refresh_period_us();
        if self.cfg.heartbeat_ms == 0 || !self.summary.due(self.now_us, server, room, period_us) {
            return;
        }
        self.summary.said(self.now_us, room, self.cfg.node);
        let hb = self.heartbeat_for(None);
        for to in self.heartbeat_dests() {
            self.send(to, Body::Heartbeat(hb.clone()));
        }
    }

    /// Tell one peer our state now: a node that joined or restarted, if we
    /// are a server with room (rather than leaving it blind until our next
    /// refresh), or a borrower that asked for more than we have (so it
    /// asks elsewhere next time).
    pub(super) fn tell(&mut self, peer: NodeId, only_with_room: bool) {
        let room = self.summary_state().1;
        if self.cfg.heartbeat_ms == 0 || (only_with_room && !room) {
            return;
        }
        if let Some(to) = self.members.get(peer).map(|p| p.ctrl_addr) {
            if !room {
                self.summary.told_no_room();
            }
            let hb = self.heartbeat_for(None);
            self.send(Dest::To(to), Body::Heartbeat(hb));
        }
    }

    /// (a server, with room for one grant unit).
    fn summary_state(&self) -> (bool, bool) {
        let unit = self.cfg.grant_unit_bytes.max(1);
        (self.status.class == NodeClass::Server, self.available_bytes() >= unit)
    }

    pub(super) fn refresh_period_us(&self) -> u64 {
        let c = &self.cfg;
        refresh_us(self.members.len(), c.heartbeat_ms, c.summaries_per_s, c.refresh_max_ms)
    }

    /// Peers that are no lease partner may be silent this long: (suspect,
    /// dead).
    pub(super) fn far_timeouts_us(&self) -> (u64, u64) {
        far_timeouts_us(self.refresh_period_us(), self.cfg.suspect_ms * MS, self.cfg.dead_ms * MS)
    }

    /// Mark silent peers suspect and drop dead ones, a partner after
    /// `dead_ms`, any other after several refresh periods.
    pub(super) fn expire_members(&mut self) {
        let near = (self.cfg.suspect_ms * MS, self.cfg.dead_ms * MS);
        let far = self.far_timeouts_us();
        let partners = self.partners();
        let timeouts = |n: NodeId| if partners.contains_key(&n) { near } else { far };
        for peer in self.members.expire(self.now_us, timeouts) {
            self.push(Output::Event(Event::PeerLost { node: peer.node }));
            self.peer_gone(peer.node, "silent");
        }
    }

    /// The node's state, with the leases `donor` lends us (none for a
    /// summary).
    pub(super) fn heartbeat_for(&self, donor: Option<NodeId>) -> Heartbeat {
        let leases = match donor {
            None => Vec::new(),
            Some(d) => self
                .borrowed
                .values()
                .filter(|b| b.donor == d && b.state != BorrowedState::Binding)
                .take(HEARTBEAT_LEASES_MAX)
                .map(|b| b.report())
                .collect(),
        };
        Heartbeat {
            name: self.cfg.name.clone(),
            class: self.status.class,
            total_bytes: self.status.total_bytes,
            used_bytes: self.status.used_bytes,
            lent_bytes: self.lent_bytes(),
            borrowed_bytes: self.borrowed_bytes(),
            available_bytes: self.available_bytes(),
            data_addr: self.cfg.data_addr,
            leases,
            domain: self.cfg.domain.clone(),
            // Summaries pass peers on; partners' heartbeats, twice a
            // second, need not.
            peers: if donor.is_none() { self.gossip_peers() } else { Vec::new() },
        }
    }

    /// Broadcast where the LAN allows it; otherwise unicast to every seed and
    /// every peer heard (a seed list is how nodes find each other without
    /// broadcast).
    pub(super) fn heartbeat_dests(&self) -> Vec<Dest> {
        if self.cfg.broadcast {
            return vec![Dest::Broadcast];
        }
        let mut to: Vec<SocketAddr> = self.cfg.seeds.clone();
        for p in self.members.iter() {
            if !to.contains(&p.ctrl_addr) {
                to.push(p.ctrl_addr);
            }
        }
        to.into_iter().map(Dest::To).collect()
    }
}
