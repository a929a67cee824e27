//! Control datagrams on the wire: number, sign and send what the engine
//! says; receive, verify, drop replays, and hand the rest to the engine.
//! A bad datagram is counted and logged (rate-limited), never fatal.

use memlend_wire::ctrl::{self, Body, CtrlKey, Envelope, NodeId, ReplayGuard, DATAGRAM_BYTES_MAX};
use std::io;
use std::net::{SocketAddr, UdpSocket};

/// Datagrams received per wakeup before the loop looks at its timers again:
/// a flood cannot starve the engine's clock.
pub const RECV_PER_WAKE_MAX: usize = 256;

pub struct Transport {
    pub sock: UdpSocket,
    key: CtrlKey,
    cluster_id: u64,
    node: NodeId,
    incarnation: u64,
    counter: u64,
    broadcast: Option<SocketAddr>,
    replay: ReplayGuard,
    pub stats: TransportStats,
}

#[derive(Default, Clone, Debug)]
pub struct TransportStats {
    pub sent: u64,
    pub send_errors: u64,
    pub received: u64,
    pub rejected: u64,
    pub replayed: u64,
    pub foreign: u64,
}

/// A datagram that passed every check.
pub struct Received {
    pub from: SocketAddr,
    pub sender: NodeId,
    pub incarnation: u64,
    pub body: Body,
}

impl Transport {
    pub fn new(
        sock: UdpSocket,
        key: CtrlKey,
        cluster_id: u64,
        node: NodeId,
        incarnation: u64,
        broadcast: Option<SocketAddr>,
    ) -> io::Result<Transport> {
        sock.set_nonblocking(true)?;
        if broadcast.is_some() {
            sock.set_broadcast(true)?;
        }
        Ok(Transport {
            sock,
            key,
            cluster_id,
            node,
            incarnation,
            counter: 0,
            broadcast,
            replay: ReplayGuard::new(),
            stats: TransportStats::default(),
        })
    }

    pub fn send(&mut self, to: Option<SocketAddr>, body: Body) {
        let Some(to) = to.or(self.broadcast) else {
            return; // broadcast asked, but this node has none: seeds cover it
        };
        self.counter += 1;
        let env = Envelope {
            cluster_id: self.cluster_id,
            sender: self.node,
            incarnation: self.incarnation,
            counter: self.counter,
            body,
        };
        let mut buf = [0u8; DATAGRAM_BYTES_MAX];
        let n = match ctrl::encode(&env, &self.key, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode a control message (a bug)");
                return;
            }
        };
        match self.sock.send_to(&buf[..n], to) {
            Ok(_) => self.stats.sent += 1,
            Err(e) => {
                self.stats.send_errors += 1;
                tracing::debug!(%to, error = %e, "control send failed");
            }
        }
    }

    /// The next good datagram, if one is waiting.
    pub fn recv(&mut self) -> Option<Received> {
        let mut buf = [0u8; DATAGRAM_BYTES_MAX + 1];
        for _ in 0..RECV_PER_WAKE_MAX {
            let (n, from) = match self.sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) => {
                    tracing::debug!(error = %e, "control recv failed");
                    return None;
                }
            };
            self.stats.received += 1;
            if let Some(r) = self.check(&buf[..n], from) {
                return Some(r);
            }
        }
        None
    }

    fn check(&mut self, datagram: &[u8], from: SocketAddr) -> Option<Received> {
        let env = match ctrl::decode(datagram, &self.key) {
            Ok(env) => env,
            Err(e) => {
                self.stats.rejected += 1;
                tracing::debug!(%from, error = %e, "control datagram rejected");
                return None;
            }
        };
        if env.cluster_id != self.cluster_id {
            self.stats.foreign += 1;
            return None;
        }
        if env.sender == self.node {
            return None; // our own broadcast
        }
        if let Err(e) = self.replay.check_and_record(env.sender, env.incarnation, env.counter) {
            self.stats.replayed += 1;
            tracing::debug!(%from, error = %e, "control datagram replayed");
            return None;
        }
        Some(Received { from, sender: env.sender, incarnation: env.incarnation, body: env.body })
    }
}
