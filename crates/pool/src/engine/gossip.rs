//! Membership without broadcast. On a LAN every summary reaches every node;
//! with seed lists a node hears only from the seeds and from whoever sends
//! to it, and nothing passed on who else exists: in a simulated 100-node
//! cluster with 3 seeds, borrowers saw a few servers and harvest fell to
//! 29% (docs/scale.md). So a heartbeat sent without broadcast carries a few
//! peers the sender knows (servers with room first, the rest in turn), and
//! a node told of a peer it has not heard sends that peer its own summary
//! at once: the peer then knows it (and, a server with room, answers with
//! its state, `Engine::tell`), as SWIM spreads membership on its probes.

use super::{Dest, Engine};
use crate::members::Peer;
use memlend_wire::ctrl::{Body, NodeClass, NodeId, PeerAddr, HEARTBEAT_PEERS_MAX};
use std::collections::BTreeMap;

/// Peers told of but not heard yet, remembered with when we last wrote to
/// them, so a peer passed on by many is contacted once per refresh period.
/// Bounded as the member table is (`members::PEERS_MAX`).
pub(super) const RUMORS_MAX: usize = 1024;

#[derive(Clone, Debug, Default)]
pub(super) struct Rumors {
    contacted_us: BTreeMap<NodeId, u64>,
}

impl Engine {
    /// The peers a heartbeat passes on: none on a LAN; else up to
    /// `HEARTBEAT_PEERS_MAX`, servers with room first, each group starting
    /// at a point that moves with time, so every member is passed on in turn.
    pub(super) fn gossip_peers(&self) -> Vec<PeerAddr> {
        if self.cfg.broadcast {
            return Vec::new();
        }
        let unit = self.cfg.grant_unit_bytes.max(1);
        let live = || self.members.iter().filter(|p| !p.suspect);
        let with_room = |p: &&Peer| p.class == NodeClass::Server && p.available_bytes >= unit;
        let turn = (self.now_us / 100_000) as usize;
        let servers: Vec<_> = live().filter(with_room).collect();
        let others: Vec<_> = live().filter(|p| !with_room(p)).collect();
        let half = HEARTBEAT_PEERS_MAX / 2;
        let mut out: Vec<PeerAddr> = Vec::with_capacity(HEARTBEAT_PEERS_MAX);
        let pick = |p: &Peer| PeerAddr { node: p.node, ctrl_addr: p.ctrl_addr };
        out.extend(rotated(&servers, turn).into_iter().take(half).map(pick));
        let room = HEARTBEAT_PEERS_MAX - out.len();
        out.extend(rotated(&others, turn).into_iter().take(room).map(pick));
        if out.len() < HEARTBEAT_PEERS_MAX {
            // Fewer others than places: more servers.
            let more = rotated(&servers, turn).into_iter().skip(half).map(pick);
            out.extend(more.take(HEARTBEAT_PEERS_MAX - out.len()));
        }
        out
    }

    /// Peers a heartbeat passed on: each one not heard yet gets our summary
    /// now, unless we wrote to it within a refresh period.
    pub(super) fn heard_of(&mut self, peers: &[PeerAddr]) {
        if self.cfg.broadcast || self.cfg.heartbeat_ms == 0 {
            return;
        }
        let period_us = self.refresh_period_us();
        let now = self.now_us;
        for p in peers.iter().take(HEARTBEAT_PEERS_MAX) {
            if p.node == self.cfg.node || self.members.get(p.node).is_some() {
                continue;
            }
            let last = self.rumors.contacted_us.get(&p.node).copied();
            if last.is_some_and(|t| now.saturating_sub(t) < period_us) {
                continue;
            }
            if last.is_none() && self.rumors.contacted_us.len() >= RUMORS_MAX {
                self.rumors.contacted_us.retain(|_, t| now.saturating_sub(*t) < period_us);
                if self.rumors.contacted_us.len() >= RUMORS_MAX {
                    continue;
                }
            }
            self.rumors.contacted_us.insert(p.node, now);
            let hb = self.heartbeat_for(None);
            self.send(Dest::To(p.ctrl_addr), Body::Heartbeat(hb));
        }
    }

    /// A peer was heard directly: no longer a rumor.
    pub(super) fn no_rumor(&mut self, node: NodeId) {
        self.rumors.contacted_us.remove(&node);
    }
}

/// `v` starting at `turn` (mod its length), wrapping around.
fn rotated<'a>(v: &[&'a Peer], turn: usize) -> Vec<&'a Peer> {
    let start = if v.is_empty() { 0 } else { turn % v.len() };
    v.iter().cycle().skip(start).take(v.len()).copied().collect()
}
