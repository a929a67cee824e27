//! The control loop: one thread owns the engine. It waits on the UDP socket
//! and the API wakeup, feeds the engine, samples memory once a second, and
//! carries out what the engine decides (datagrams, data-plane reservations,
//! messages to local processes).

use super::api_server::Cmd;
use super::sense::Sense;
use super::timeline::Timeline;
use super::transport::Transport;
use super::wake::{poll_readable, WakeRx};
use memlend_pool::api::{self, Ask, LeaseGrant, Tell};
use memlend_pool::engine::{Dest, Engine, Event, Output, AVOID_NODES_MAX, MS, WANT_BYTES_MAX};
use memlend_server::lifecycle::Shutdown;
use memlend_server::page::PageServer;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

/// Commands handled per wakeup, so API traffic cannot starve the timers.
const CMDS_PER_WAKE_MAX: usize = 256;
const SAMPLE_US: u64 = 1_000 * MS;

pub struct Control {
    pub engine: Engine,
    pub transport: Transport,
    pub sense: Sense,
    pub server: Arc<PageServer>,
    pub cmds: Receiver<Cmd>,
    pub snapshots: Receiver<SyncSender<api::ClusterStatus>>,
    pub wake: WakeRx,
    pub timeline: Option<Timeline>,
    pub shutdown: Shutdown,
    pub clients: HashMap<u64, UnixStream>,
    /// Each process's far memory at home (`Ask::Home`), counted as demand.
    pub home_bytes: HashMap<u64, u64>,
    pub start: Instant,
    pub next_sample_us: u64,
}

impl Control {
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn run(mut self) {
        while !self.shutdown.is_stopping() {
            let now = self.now_us();
            let due = self.engine.next_deadline_us().min(self.next_sample_us);
            let wait_ms = (due.saturating_sub(now) / MS).clamp(1, 200) as i32;
            poll_readable(&[self.transport.sock.as_raw_fd(), self.wake.fd()], wait_ms);
            self.wake.drain();
            while let Some(r) = self.transport.recv() {
                let now = self.now_us();
                if let Some(t) = self.timeline.as_mut() {
                    t.message(now, "recv", &r.body, r.sender);
                }
                self.engine.on_message(now, r.from, r.sender, r.incarnation, r.body);
                self.drain();
            }
            for _ in 0..CMDS_PER_WAKE_MAX {
                let Ok(cmd) = self.cmds.try_recv() else { break };
                self.command(cmd);
            }
            while let Ok(reply) = self.snapshots.try_recv() {
                let _ =
                    reply.try_send(super::status::snapshot(&self.engine, &self.transport.stats));
            }
            let now = self.now_us();
            if now >= self.next_sample_us {
                self.next_sample_us = now + SAMPLE_US;
                self.sample(now);
            }
            self.engine.tick(now);
            self.drain();
        }
    }

    fn sample(&mut self, now: u64) {
        let lent = self.engine.lent_bytes();
        // Borrowed or still wanted: either way this node's processes need
        // memory it does not have, which makes it a client.
        let home: u64 = self.home_bytes.values().sum();
        let demand = self.engine.unmet_demand_bytes() + self.engine.borrowed_bytes() + home;
        match self.sense.sample(now / MS, lent, demand) {
            Ok(status) => self.engine.set_status(now, status),
            Err(e) => tracing::warn!(error = %e, "cannot read memory use"),
        }
        let server = self.server.stats();
        if let Some(t) = self.timeline.as_mut() {
            t.sample(now, &self.engine, server);
        }
    }

    fn command(&mut self, cmd: Cmd) {
        let now = self.now_us();
        match cmd {
            Cmd::Open { owner, writer } => {
                self.clients.insert(owner, writer);
            }
            Cmd::Closed { owner } => {
                self.clients.remove(&owner);
                self.home_bytes.remove(&owner);
                self.engine.drop_owner(now, owner);
            }
            Cmd::Ask { owner, ask } => self.ask(now, owner, ask),
        }
        self.drain();
    }

    fn ask(&mut self, now: u64, owner: u64, ask: Ask) {
        match ask {
            Ask::Want { bytes, .. } if bytes > WANT_BYTES_MAX => {
                let message =
                    format!("want of {bytes} bytes is over the limit of {WANT_BYTES_MAX}");
                self.tell(owner, &Tell::Error { message });
            }
            Ask::Want { avoid, .. } if avoid.len() > AVOID_NODES_MAX => {
                let n = avoid.len();
                let message = format!("a want avoids {n} nodes; the limit is {AVOID_NODES_MAX}");
                self.tell(owner, &Tell::Error { message });
            }
            Ask::Want { bytes, avoid } => self.engine.want_avoiding(now, owner, bytes, &avoid),
            Ask::Release { donor, lease } => {
                if !self.engine.release_owned(now, owner, donor, lease) {
                    let message = format!("lease {lease} of node {donor:016x} is not yours");
                    self.tell(owner, &Tell::Error { message });
                }
            }
            Ask::Activity { donor, lease, pages_per_s } => {
                self.engine.set_activity(owner, donor, lease, pages_per_s)
            }
            Ask::Home { bytes } if bytes > WANT_BYTES_MAX => {
                let message =
                    format!("{bytes} bytes at home is over the limit of {WANT_BYTES_MAX}");
                self.tell(owner, &Tell::Error { message });
            }
            Ask::Home { bytes: 0 } => {
                self.home_bytes.remove(&owner);
            }
            Ask::Home { bytes } => {
                self.home_bytes.insert(owner, bytes);
            }
            Ask::Status => {
                let s = super::status::snapshot(&self.engine, &self.transport.stats);
                self.tell(owner, &Tell::Status(Box::new(s)));
            }
        }
    }

    /// Carry out everything the engine has decided.
    fn drain(&mut self) {
        while let Some(o) = self.engine.poll_output() {
            match o {
                Output::Send { to, body } => {
                    if let Some(t) = self.timeline.as_mut() {
                        t.message(self.start.elapsed().as_micros() as u64, "send", &body, 0);
                    }
                    let to = match to {
                        Dest::Broadcast => None,
                        Dest::To(a) => Some(a),
                    };
                    self.transport.send(to, body);
                }
                Output::Event(e) => self.event(e),
            }
        }
    }

    fn event(&mut self, e: Event) {
        let registry = self.server.registry();
        match e {
            Event::Reserve { lease, credential, bytes } => {
                registry.grant(credential, bytes / memlend_store::PAGE_SIZE as u64);
                tracing::info!(lease, bytes, "lease granted");
            }
            Event::Unreserve { lease, credential, why } => {
                let pages = registry.revoke(credential);
                tracing::info!(lease, pages_freed = pages, why, "lease ended");
            }
            Event::LeaseReady { owner, lease } => {
                let peer = self.engine.members().get(lease.donor);
                let donor_name = peer.map(|p| p.name.clone()).unwrap_or_default();
                let donor_domain = peer.map(|p| p.domain.clone()).unwrap_or_default();
                let g = LeaseGrant {
                    donor: lease.donor,
                    donor_name,
                    donor_domain,
                    lease: lease.lease,
                    bytes: lease.bytes,
                    data_addr: lease.data_addr,
                    credential: api::credential_hex(&lease.credential),
                };
                tracing::info!(owner, donor = %g.donor_name, lease = g.lease, bytes = g.bytes, "borrowed");
                if !self.tell(owner, &Tell::Lease(g)) {
                    let now = self.now_us();
                    self.engine.release(now, lease.donor, lease.lease);
                }
            }
            Event::DemandUnmet { owner, bytes } => {
                tracing::info!(owner, bytes, "demand unmet: no donor has room");
                self.tell(owner, &Tell::Unmet { bytes });
            }
            Event::ReclaimRequested { owner, donor, lease, deadline_us } => {
                let deadline_ms = deadline_us.saturating_sub(self.now_us()) / MS;
                tracing::info!(owner, donor, lease, deadline_ms, "donor reclaims a lease");
                self.tell(owner, &Tell::Reclaim { donor, lease, deadline_ms });
            }
            Event::LeaseLost { owner, donor, lease, why } => {
                tracing::warn!(owner, donor, lease, why, "lease lost");
                self.tell(owner, &Tell::Lost { donor, lease, why: why.to_string() });
            }
            Event::PeerJoined { node } => tracing::info!(node, "peer joined"),
            Event::PeerLost { node } => tracing::warn!(node, "peer lost"),
            Event::ClassChanged { from, to } => tracing::info!(?from, ?to, "class changed"),
        }
    }

    /// Write to a process; false (and forget it) if it is gone or stuck.
    fn tell(&mut self, owner: u64, t: &Tell) -> bool {
        let Some(w) = self.clients.get_mut(&owner) else { return false };
        if api::write_json(w, t).is_ok() {
            return true;
        }
        tracing::warn!(owner, "API client not reading; dropping it");
        if let Some(w) = self.clients.remove(&owner) {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        false
    }
}
