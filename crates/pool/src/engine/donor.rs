//! The donor's side: answer requests with grants, bind them on ACK, expire
//! what is never bound, reclaim when the node needs its memory back.

use super::{Dest, Engine, Event, Lent, LentState, Output, MS};
use memlend_wire::ctrl::{
    Ack, Body, Credential, Grant, Heartbeat, LeaseId, NodeClass, NodeId, Offer, Reclaim, Release,
    ReleaseReason, Request,
};
use std::net::SocketAddr;

impl Engine {
    /// What is left to grant: the classifier's allowance minus what is out.
    pub fn available_bytes(&self) -> u64 {
        if self.status.class != NodeClass::Server {
            return 0;
        }
        self.status.lendable_bytes.saturating_sub(self.lent_bytes())
    }

    pub(super) fn on_request(&mut self, borrower: NodeId, from: SocketAddr, r: &Request) {
        // A retransmitted request gets the same grant again: idempotent.
        if let Some(l) =
            self.lent.values().find(|l| l.borrower == borrower && l.request_id == r.request_id)
        {
            if matches!(l.state, LentState::Granted { .. }) {
                let g = self.grant_for(l);
                self.send(Dest::To(from), Body::Grant(g));
            }
            return;
        }
        let unit = self.cfg.grant_unit_bytes.max(1);
        let bytes = r.bytes.min(self.available_bytes()) / unit * unit;
        let suspect = self.members.get(borrower).is_none_or(|p| p.suspect);
        if bytes == 0 || bytes < r.bytes_min {
            // Its view of our room is stale (`summary.rs` does not tell
            // everyone when room is lent out): correct it.
            self.tell(borrower, false);
            return;
        }
        if suspect || self.lent.len() >= self.cfg.lent_max {
            return; // silence: the client asks elsewhere or retries
        }
        let lease = self.next_lease_id;
        self.next_lease_id += 1;
        let l = Lent {
            lease,
            borrower,
            borrower_addr: from,
            request_id: r.request_id,
            bytes,
            credential: self.credential(lease),
            state: LentState::Granted {
                expires_us: self.now_us + u64::from(self.cfg.grant_ack_ms) * MS,
            },
            granted_us: self.now_us,
            reported_us: self.now_us,
            pages_per_s: 0,
        };
        let g = self.grant_for(&l);
        self.push(Output::Event(Event::Reserve { lease, credential: l.credential, bytes }));
        self.lent.insert(lease, l);
        self.send(Dest::To(from), Body::Grant(g));
    }

    fn grant_for(&self, l: &Lent) -> Grant {
        Grant {
            request_id: l.request_id,
            lease_id: l.lease,
            bytes: l.bytes,
            data_addr: self.cfg.data_addr,
            credential: l.credential,
            ack_within_ms: self.cfg.grant_ack_ms,
        }
    }

    /// Unpredictable without the daemon's secret; unique per lease id.
    fn credential(&self, lease: LeaseId) -> Credential {
        use hmac::{Hmac, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.cfg.credential_secret)
            .expect("HMAC takes any key length");
        mac.update(b"memlend/v1/lease");
        mac.update(&lease.to_le_bytes());
        let tag = mac.finalize().into_bytes();
        let mut c = [0u8; 16];
        c.copy_from_slice(&tag[..16]);
        c
    }

    pub(super) fn on_ack(&mut self, borrower: NodeId, from: SocketAddr, a: &Ack) {
        let Some(l) = self.lent.get_mut(&a.lease_id).filter(|l| l.borrower == borrower) else {
            let r = Release { lease_id: a.lease_id, reason: ReleaseReason::Unknown };
            self.send(Dest::To(from), Body::Release(r));
            return;
        };
        if matches!(l.state, LentState::Granted { .. }) {
            l.state = LentState::Active;
        }
        l.reported_us = self.now_us;
        let confirm = Ack { request_id: a.request_id, lease_id: a.lease_id, confirm: true };
        self.send(Dest::To(from), Body::Ack(confirm));
    }

    /// A borrower's RELEASE (reason Done) of a lease we lend.
    pub(super) fn on_release_lent(&mut self, borrower: NodeId, lease: LeaseId) {
        if self.lent.get(&lease).is_some_and(|l| l.borrower == borrower) {
            self.free_lent(lease, "released");
        }
    }

    pub(super) fn donor_heard_reports(&mut self, borrower: NodeId, hb: &Heartbeat) {
        let me = self.cfg.node;
        for r in hb.leases.iter().filter(|r| r.donor == me) {
            match self.lent.get_mut(&r.lease_id) {
                Some(l) if l.borrower == borrower => {
                    l.reported_us = self.now_us;
                    l.pages_per_s = r.pages_per_s;
                }
                // The borrower believes in a lease we do not have.
                _ => {
                    let rel = Release { lease_id: r.lease_id, reason: ReleaseReason::Unknown };
                    let to = self.members.get(borrower).map(|p| p.ctrl_addr);
                    if let Some(to) = to {
                        self.send(Dest::To(to), Body::Release(rel));
                    }
                }
            }
        }
    }

    fn free_lent(&mut self, lease: LeaseId, why: &'static str) {
        if let Some(l) = self.lent.remove(&lease) {
            self.push(Output::Event(Event::Unreserve { lease, credential: l.credential, why }));
        }
    }

    /// Drop a lease and tell its borrower (it may still be alive).
    fn revoke(&mut self, lease: LeaseId, why: &'static str) {
        if let Some(to) = self.lent.get(&lease).map(|l| l.borrower_addr) {
            let r = Release { lease_id: lease, reason: ReleaseReason::Revoked };
            self.send(Dest::To(to), Body::Release(r));
            self.free_lent(lease, why);
        }
    }

    pub(super) fn revoke_lent_to(&mut self, borrower: NodeId, why: &'static str) {
        let gone: Vec<LeaseId> =
            self.lent.values().filter(|l| l.borrower == borrower).map(|l| l.lease).collect();
        for lease in gone {
            self.free_lent(lease, why);
        }
    }

    pub(super) fn donor_timers(&mut self) {
        let now = self.now_us;
        let stranded_us = self.cfg.stranded_ms * MS;
        let leases: Vec<LeaseId> = self.lent.keys().copied().collect();
        for lease in leases {
            let l = &self.lent[&lease];
            match l.state {
                LentState::Granted { expires_us } if now >= expires_us => {
                    self.metrics.grants_expired += 1;
                    self.free_lent(lease, "grant never acknowledged");
                }
                LentState::Reclaiming { deadline_us, .. } if now >= deadline_us => {
                    self.metrics.reclaims_overdue += 1;
                    self.revoke(lease, "reclaim deadline passed");
                }
                LentState::Active | LentState::Reclaiming { .. }
                    if now >= l.reported_us + stranded_us =>
                {
                    self.metrics.leases_stranded += 1;
                    self.revoke(lease, "borrower stopped reporting it");
                }
                LentState::Reclaiming { deadline_us, next_send_us } if now >= next_send_us => {
                    self.send_reclaim(lease, deadline_us);
                }
                _ => {}
            }
        }
        self.offer_timer();
    }

    fn offer_timer(&mut self) {
        let available = self.available_bytes();
        if available == 0 || !self.servers_broadcast() || self.now_us < self.next_offer_us {
            return;
        }
        // Stable availability (within 1/8): back off; a change: offer often.
        let stable = available.abs_diff(self.last_offer_bytes) <= self.last_offer_bytes / 8;
        self.offer_period_us = if stable {
            (self.offer_period_us * 2).min(self.cfg.offer_max_ms * MS)
        } else {
            self.cfg.offer_min_ms * MS
        };
        self.last_offer_bytes = available;
        self.next_offer_us = self.now_us + self.offer_period_us;
        let o = Offer {
            available_bytes: available,
            data_addr: self.cfg.data_addr,
            next_offer_ms: (self.offer_period_us / MS) as u32,
        };
        for to in self.heartbeat_dests() {
            self.send(to, Body::Offer(o.clone()));
        }
    }

    /// The node needs memory back: ask for the least active leases first,
    /// until what stays lent fits the allowance. Unbound grants go at once.
    pub(super) fn reclaim_if_needed(&mut self) {
        let allowance =
            if self.status.class == NodeClass::Server { self.status.lendable_bytes } else { 0 };
        let pending: Vec<LeaseId> = self
            .lent
            .values()
            .filter(|l| matches!(l.state, LentState::Granted { .. }))
            .map(|l| l.lease)
            .collect();
        if self.lent_bytes() > allowance {
            for lease in pending {
                self.revoke(lease, "donor needs its memory");
            }
        }
        let reclaiming: u64 = self
            .lent
            .values()
            .filter(|l| matches!(l.state, LentState::Reclaiming { .. }))
            .map(|l| l.bytes)
            .sum();
        let mut excess = self.lent_bytes().saturating_sub(allowance).saturating_sub(reclaiming);
        let mut active: Vec<&Lent> =
            self.lent.values().filter(|l| l.state == LentState::Active).collect();
        active.sort_by_key(|l| (l.pages_per_s, l.granted_us));
        let mut chosen = Vec::new();
        for l in active {
            if excess == 0 {
                break;
            }
            excess = excess.saturating_sub(l.bytes);
            chosen.push(l.lease);
        }
        let deadline_us = self.now_us + u64::from(self.cfg.reclaim_deadline_ms) * MS;
        for lease in chosen {
            self.metrics.reclaims_sent += 1;
            self.send_reclaim(lease, deadline_us);
        }
    }

    fn send_reclaim(&mut self, lease: LeaseId, deadline_us: u64) {
        let next_send_us = self.now_us + self.cfg.retry_max_ms * MS;
        let Some(l) = self.lent.get_mut(&lease) else { return };
        l.state = LentState::Reclaiming { deadline_us, next_send_us };
        let r = Reclaim {
            lease_id: lease,
            bytes: l.bytes,
            deadline_ms: (deadline_us.saturating_sub(self.now_us) / MS) as u32,
        };
        let to = l.borrower_addr;
        self.send(Dest::To(to), Body::Reclaim(r));
    }

    pub(super) fn donor_deadline_us(&self) -> u64 {
        let stranded_us = self.cfg.stranded_ms * MS;
        let mut t = u64::MAX;
        for l in self.lent.values() {
            t = t.min(match l.state {
                LentState::Granted { expires_us } => expires_us,
                LentState::Active => l.reported_us + stranded_us,
                LentState::Reclaiming { deadline_us, next_send_us } => {
                    deadline_us.min(next_send_us)
                }
            });
        }
        if self.available_bytes() > 0 && self.servers_broadcast() {
            t = t.min(self.next_offer_us);
        }
        t
    }
}
