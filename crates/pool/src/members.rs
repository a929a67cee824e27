//! Who is in the cluster, as heard in heartbeats: each peer's address, class
//! and memory, and whether it is still alive. Failure detection is by
//! silence (ExpEther's keep-alive, without SWIM's indirect probes: on one
//! LAN segment a missed heartbeat is rarely the path's fault, and a false
//! suspicion costs only a delayed grant, never data). How long a peer may be
//! silent is the caller's choice per peer: the engine hears its lease
//! partners every heartbeat and the others only at their slow summary
//! refresh (`engine/heartbeat.rs`).

use memlend_wire::ctrl::{Heartbeat, NodeClass, NodeId};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Most peers one node tracks, so a flood of ids cannot grow memory without
/// bound. Past it a newcomer is refused unless the engine makes room for it
/// (`Members::forget_one`): a server with room, or a peer in a handshake,
/// takes the place of the longest-silent peer the engine can spare.
pub const PEERS_MAX: usize = 1024;

/// One peer as last heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node: NodeId,
    pub name: String,
    /// Its failure domain, empty when it names none.
    pub domain: String,
    pub incarnation: u64,
    /// Where its control datagrams come from (and where we answer).
    pub ctrl_addr: SocketAddr,
    pub data_addr: SocketAddr,
    pub class: NodeClass,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub lent_bytes: u64,
    pub borrowed_bytes: u64,
    pub available_bytes: u64,
    pub last_heard_us: u64,
    pub suspect: bool,
}

/// What hearing from a peer changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// First time, or after it was declared dead.
    Joined,
    /// A higher incarnation: the node restarted, so everything of the old one
    /// is gone (its grants and leases must be dropped at once).
    Restarted,
    /// An older incarnation than we know: a stale datagram, ignored.
    Stale,
    Known,
    /// The table is full.
    Refused,
}

#[derive(Clone, Debug, Default)]
pub struct Members {
    peers: BTreeMap<NodeId, Peer>,
}

impl Members {
    /// Note any datagram from `node`: it proves liveness even without a
    /// heartbeat (a grant or an ACK is as good).
    pub fn touch(
        &mut self,
        node: NodeId,
        incarnation: u64,
        from: SocketAddr,
        now_us: u64,
    ) -> Heard {
        let full = self.peers.len() >= PEERS_MAX;
        match self.peers.get_mut(&node) {
            Some(p) if incarnation < p.incarnation => Heard::Stale,
            Some(p) if incarnation > p.incarnation => {
                *p = Peer::unknown(node, incarnation, from, now_us);
                Heard::Restarted
            }
            Some(p) => {
                p.last_heard_us = now_us;
                p.ctrl_addr = from;
                p.suspect = false;
                Heard::Known
            }
            None if full => Heard::Refused,
            None => {
                self.peers.insert(node, Peer::unknown(node, incarnation, from, now_us));
                Heard::Joined
            }
        }
    }

    /// Record a heartbeat's contents (after `touch`).
    pub fn update(&mut self, node: NodeId, hb: &Heartbeat) {
        if let Some(p) = self.peers.get_mut(&node) {
            p.name.clone_from(&hb.name);
            p.domain.clone_from(&hb.domain);
            p.class = hb.class;
            p.total_bytes = hb.total_bytes;
            p.used_bytes = hb.used_bytes;
            p.lent_bytes = hb.lent_bytes;
            p.borrowed_bytes = hb.borrowed_bytes;
            p.available_bytes = hb.available_bytes;
            p.data_addr = hb.data_addr;
        }
    }

    /// Mark peers silent for their suspect time as suspect, and remove (and
    /// return) those silent for their dead time; `timeouts(node)` gives
    /// both, in µs.
    pub fn expire(&mut self, now_us: u64, timeouts: impl Fn(NodeId) -> (u64, u64)) -> Vec<Peer> {
        let mut dead = Vec::new();
        self.peers.retain(|_, p| {
            let (suspect_us, dead_us) = timeouts(p.node);
            let silent_us = now_us.saturating_sub(p.last_heard_us);
            p.suspect = silent_us >= suspect_us;
            if silent_us >= dead_us {
                dead.push(p.clone());
                return false;
            }
            true
        });
        dead
    }

    pub fn get(&self, node: NodeId) -> Option<&Peer> {
        self.peers.get(&node)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// When the table is full, forget the longest-silent peer that `keep`
    /// does not want kept, and say which; None if the table has room or
    /// every peer is kept. One pass over the table, only when it is full.
    pub fn forget_one(&mut self, keep: impl Fn(&Peer) -> bool) -> Option<NodeId> {
        if self.peers.len() < PEERS_MAX {
            return None;
        }
        let spare = self.peers.values().filter(|p| !keep(p)).min_by_key(|p| p.last_heard_us)?;
        let node = spare.node;
        self.peers.remove(&node);
        Some(node)
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Live (not suspect) peers of a class.
    pub fn count(&self, class: NodeClass) -> usize {
        self.peers.values().filter(|p| p.class == class && !p.suspect).count()
    }
}

impl Peer {
    fn unknown(node: NodeId, incarnation: u64, from: SocketAddr, now_us: u64) -> Peer {
        Peer {
            node,
            name: String::new(),
            domain: String::new(),
            incarnation,
            ctrl_addr: from,
            data_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            class: NodeClass::Neutral,
            total_bytes: 0,
            used_bytes: 0,
            lent_bytes: 0,
            borrowed_bytes: 0,
            available_bytes: 0,
            last_heard_us: now_us,
            suspect: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn join_restart_stale_and_death() {
        let mut m = Members::default();
        assert_eq!(m.touch(7, 100, addr(1), 0), Heard::Joined);
        assert_eq!(m.touch(7, 100, addr(1), 500), Heard::Known);
        assert_eq!(m.touch(7, 99, addr(1), 600), Heard::Stale);
        assert_eq!(m.touch(7, 101, addr(2), 700), Heard::Restarted);
        assert_eq!(m.get(7).unwrap().ctrl_addr, addr(2));
        assert!(m.expire(2_000, |_| (1_000, 3_000)).is_empty());
        assert!(m.get(7).unwrap().suspect);
        let dead = m.expire(3_700, |_| (1_000, 3_000));
        assert_eq!(dead.len(), 1);
        assert!(m.is_empty());
        assert_eq!(m.touch(7, 101, addr(2), 3_800), Heard::Joined);
    }

    #[test]
    fn a_full_table_forgets_the_longest_silent_peer_it_may_spare() {
        let mut m = Members::default();
        assert_eq!(m.forget_one(|_| false), None, "room left: nothing forgotten");
        for n in 0..PEERS_MAX as u64 {
            m.touch(n, 1, addr(1), 1_000 + n);
        }
        assert_eq!(m.touch(9_999, 1, addr(2), 5_000), Heard::Refused);
        assert_eq!(m.forget_one(|p| p.node == 0), Some(1), "0 is kept, 1 is the next oldest");
        assert_eq!(m.touch(9_999, 1, addr(2), 5_000), Heard::Joined);
        assert_eq!(m.len(), PEERS_MAX);
        assert_eq!(m.forget_one(|_| true), None, "every peer kept: the newcomer waits");
    }

    #[test]
    fn each_peer_has_its_own_timeouts() {
        let mut m = Members::default();
        m.touch(1, 1, addr(1), 0);
        m.touch(2, 1, addr(2), 0);
        let t = |n: NodeId| if n == 1 { (1_000, 3_000) } else { (30_000, 60_000) };
        let dead = m.expire(3_000, t);
        assert_eq!(dead.iter().map(|p| p.node).collect::<Vec<_>>(), vec![1]);
        assert!(!m.get(2).unwrap().suspect, "a far peer is not suspect yet");
    }

    #[test]
    fn the_table_is_bounded() {
        let mut m = Members::default();
        for n in 0..PEERS_MAX as u64 {
            assert_eq!(m.touch(n, 1, addr(1), 0), Heard::Joined);
        }
        assert_eq!(m.touch(u64::MAX, 1, addr(1), 0), Heard::Refused);
        assert_eq!(m.len(), PEERS_MAX);
    }
}
