//! One simulated node: the real engine and classifier, its memory trace,
//! its transport state (datagram counter, replay guard) and the borrower
//! agent's bookkeeping. A crash throws the engine away; a restart builds a
//! fresh one under the same name, one incarnation later.

use crate::rng::{mix, Rng};
use crate::workload::Trace;
use memlend_pool::classify::{Classifier, Thresholds};
use memlend_pool::engine::{BorrowedState, Config, Engine, LentState, Metrics};
use memlend_pool::select::{make, SelectorKind};
use memlend_wire::ctrl::{LeaseId, NodeId, ReplayGuard};
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};

/// The one local owner (process) that holds every lease of a node; with
/// mirroring, the first leg's.
pub const OWNER: u64 = 1;
/// The second leg's owner when borrowers mirror.
pub const OWNER_B: u64 = 2;
const CTRL_PORT: u16 = 7071;
const DATA_PORT: u16 = 7070;

pub struct SimNode {
    pub index: u32,
    pub id: NodeId,
    pub name: String,
    /// Its failure domain, empty for none.
    pub domain: String,
    /// How its engine is set up beyond the defaults.
    pub setup: Setup,
    pub up: bool,
    pub incarnation: u64,
    pub engine: Engine,
    pub classifier: Classifier,
    pub trace: Trace,
    /// Transport: the last datagram number sent, and the receive side's
    /// replay window (as `memlendd`'s transport keeps them).
    pub counter: u64,
    pub replay: ReplayGuard,
    /// The earliest tick queued for this incarnation (u64::MAX: none).
    pub tick_at_us: u64,
    /// When the current unmet demand began (the first `want` not yet
    /// covered by active leases).
    pub demand_since_us: Option<u64>,
    /// Remote need at the last sample: what the agent asked the engine for.
    pub need_bytes: u64,
    /// Metrics of engines lost in crashes, so counts survive restarts.
    pub retired: Metrics,
}

impl SimNode {
    pub fn new(index: u32, trace: Trace, rng: &mut Rng, setup: Setup) -> SimNode {
        let name = format!("n{index:05}");
        let domain = match setup.racks {
            0 => String::new(),
            r => format!("r{}", index as usize % r),
        };
        let (engine, classifier) = fresh(index, &name, &domain, setup, rng);
        SimNode {
            index,
            id: node_id(index),
            name,
            domain,
            setup,
            up: false, // until its boot event
            incarnation: 1,
            engine,
            classifier,
            trace,
            counter: 0,
            replay: ReplayGuard::new(),
            tick_at_us: u64::MAX,
            demand_since_us: None,
            need_bytes: 0,
            retired: Metrics::default(),
        }
    }

    pub fn crash(&mut self) {
        self.up = false;
        add_metrics(&mut self.retired, self.engine.metrics());
    }

    pub fn restart(&mut self, rng: &mut Rng) {
        let (engine, classifier) = fresh(self.index, &self.name, &self.domain, self.setup, rng);
        self.engine = engine;
        self.classifier = classifier;
        self.incarnation += 1;
        self.counter = 0;
        self.replay = ReplayGuard::new();
        self.tick_at_us = u64::MAX;
        self.demand_since_us = None;
        self.need_bytes = 0;
        self.up = true;
    }

    /// Bytes of leases that serve the node now (bound and not reclaimed).
    pub fn active_borrowed_bytes(&self) -> u64 {
        self.engine.borrowed().filter(|b| b.state == BorrowedState::Active).map(|b| b.bytes).sum()
    }

    /// Bytes `owner` holds or is binding (not being reclaimed).
    pub fn held_bytes_of(&self, owner: u64) -> u64 {
        self.engine
            .borrowed()
            .filter(|b| b.owner == owner && !matches!(b.state, BorrowedState::Reclaimed { .. }))
            .map(|b| b.bytes)
            .sum()
    }

    /// The donors of `owner`'s leases, reclaimed ones included (their pages
    /// are still there while they move).
    pub fn donors_of(&self, owner: u64) -> Vec<NodeId> {
        let mut v: Vec<NodeId> =
            self.engine.borrowed().filter(|b| b.owner == owner).map(|b| b.donor).collect();
        v.sort_unstable();
        v.dedup();
        v.truncate(memlend_pool::engine::AVOID_NODES_MAX);
        v
    }

    /// This incarnation's metrics plus those of crashed ones.
    pub fn metrics(&self) -> Metrics {
        let mut m = self.retired.clone();
        if self.up {
            add_metrics(&mut m, self.engine.metrics());
        }
        m
    }
}

/// What a node's engine does beyond the daemon's defaults (broadcast on
/// one LAN, first come, the default guard bands and timing).
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// Failure domains: node i sits in rack i mod `racks` (0: none named).
    pub racks: usize,
    pub selector: SelectorKind,
    /// Without broadcast: nodes 0..seeds are every node's seed list, and
    /// heartbeats go by unicast (0: broadcast).
    pub seeds: usize,
}

fn fresh(
    index: u32,
    name: &str,
    domain: &str,
    setup: Setup,
    rng: &mut Rng,
) -> (Engine, Classifier) {
    let mut secret = [0u8; 32];
    for chunk in secret.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let mut cfg = Config::new(node_id(index), name, data_addr(index), secret);
    cfg.domain = domain.to_string();
    if setup.seeds > 0 {
        cfg.broadcast = false;
        cfg.seeds = (0..setup.seeds as u32).filter(|&s| s != index).map(ctrl_addr).collect();
    }
    let engine = Engine::new(cfg, make(setup.selector));
    let classifier = Classifier::new(Thresholds::default(), Default::default())
        .expect("the default timing is valid");
    (engine, classifier)
}

fn add_metrics(into: &mut Metrics, m: &Metrics) {
    for k in 0..7 {
        into.sent[k] += m.sent[k];
        into.received[k] += m.received[k];
    }
    into.class_changes += m.class_changes;
    into.grants_expired += m.grants_expired;
    into.leases_stranded += m.leases_stranded;
    into.reclaims_sent += m.reclaims_sent;
    into.reclaims_overdue += m.reclaims_overdue;
    into.demands_unmet += m.demands_unmet;
    into.leases_lost += m.leases_lost;
    into.migrations += m.migrations;
}

/// Distinct per node (the finaliser is a bijection), stable across
/// restarts, as the daemon's id from its name is.
pub fn node_id(index: u32) -> NodeId {
    mix(u64::from(index) + 1)
}

fn ip(index: u32) -> Ipv4Addr {
    let [_, a, b, c] = index.to_be_bytes();
    Ipv4Addr::new(10, a, b, c)
}

pub fn ctrl_addr(index: u32) -> SocketAddr {
    SocketAddr::from((ip(index), CTRL_PORT))
}

fn data_addr(index: u32) -> SocketAddr {
    SocketAddr::from((ip(index), DATA_PORT))
}

/// The node a control address belongs to (the inverse of `ctrl_addr`).
pub fn index_of(addr: SocketAddr) -> Option<u32> {
    match addr {
        SocketAddr::V4(a) if a.port() == CTRL_PORT => {
            let [_, x, y, z] = a.ip().octets();
            Some(u32::from_be_bytes([0, x, y, z]))
        }
        _ => None,
    }
}

/// Leases one side holds and the other does not list: (stranded, all
/// leases held). A node that is down holds nothing. Grants not yet
/// acknowledged and leases still binding are in flight, not stranded.
pub fn stranded(nodes: &[SimNode]) -> (u64, u64) {
    type Key = (NodeId, LeaseId, NodeId); // donor, lease, borrower
    let mut donors: BTreeSet<Key> = BTreeSet::new();
    let mut borrowers: BTreeSet<Key> = BTreeSet::new();
    let (mut donors_all, mut borrowers_all) = (BTreeSet::new(), BTreeSet::new());
    for n in nodes.iter().filter(|n| n.up) {
        let me = node_id(n.index);
        for l in n.engine.lent() {
            donors_all.insert((me, l.lease, l.borrower));
            if !matches!(l.state, LentState::Granted { .. }) {
                donors.insert((me, l.lease, l.borrower));
            }
        }
        for b in n.engine.borrowed() {
            borrowers_all.insert((b.donor, b.lease, me));
            if b.state != BorrowedState::Binding {
                borrowers.insert((b.donor, b.lease, me));
            }
        }
    }
    let lonely_lent = donors.difference(&borrowers_all).count();
    let lonely_borrowed = borrowers.difference(&donors_all).count();
    ((lonely_lent + lonely_borrowed) as u64, borrowers.len() as u64)
}
