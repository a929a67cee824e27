//! Exhaustive check of the handshake: one client and two servers, every
//! interleaving of deliveries, up to one lost and one duplicated datagram
//! (reordering comes free: any datagram in flight may be delivered next),
//! and timers firing between any two steps, to a bounded depth. At every
//! state the safety invariants hold; from every state at the bound, a run
//! with no more faults must settle with nothing stranded and the demand
//! answered.

use memlend_pool::engine::{BorrowedState, Config, Dest, Engine, Event, LentState, Output, Status};
use memlend_pool::select::FirstCome;
use memlend_wire::ctrl::{Body, Heartbeat, LeaseId, NodeClass};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

const MIB: u64 = 1 << 20;
const CLIENT: usize = 0;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7071))
}

#[derive(Clone)]
struct World {
    nodes: Vec<Engine>,
    reserved: Vec<BTreeMap<LeaseId, u64>>,
    answered: u32,
    flight: Vec<(usize, usize, Body)>,
    now_us: u64,
    drops_left: u8,
    dups_left: u8,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Deliver(usize),
    Drop(usize),
    Dup(usize),
    Tick,
}

fn config(i: usize) -> Config {
    let mut c = Config::new(100 + i as u64, &format!("n{i}"), addr(i), [i as u8; 32]);
    // Heartbeats go on a reliable side channel (delivered at once, never
    // lost): they are the leases' safety net, not the handshake under test,
    // and nobody dies.
    c.heartbeat_ms = 1_000;
    c.suspect_ms = 1 << 30;
    c.dead_ms = 1 << 30;
    c.stranded_ms = 3_000;
    c.retry_attempts = 3;
    c
}

impl World {
    fn new(four_way: bool) -> World {
        let mut w = World {
            nodes: (0..3).map(|i| Engine::new(config(i), Box::new(FirstCome))).collect(),
            reserved: vec![BTreeMap::new(); 3],
            answered: 0,
            flight: Vec::new(),
            now_us: 1_000,
            drops_left: 1,
            dups_left: 1,
        };
        // 4-way needs servers to be no more numerous than clients: then the
        // second server is neutral and the one server offers.
        let class = |i| match i {
            CLIENT => NodeClass::Client,
            2 if four_way => NodeClass::Neutral,
            _ => NodeClass::Server,
        };
        for i in 0..3 {
            let s = Status {
                class: class(i),
                total_bytes: 4 << 30,
                used_bytes: 1 << 30,
                lendable_bytes: 1 << 30,
            };
            w.nodes[i].set_status(w.now_us, s);
        }
        if four_way {
            // The client has heard S1 as a server, and its offer.
            let hb = Heartbeat {
                name: "n1".into(),
                class: NodeClass::Server,
                total_bytes: 4 << 30,
                used_bytes: 1 << 30,
                lent_bytes: 0,
                borrowed_bytes: 0,
                available_bytes: 1 << 30,
                data_addr: addr(1),
                leases: Vec::new(),
                domain: String::new(),
                peers: Vec::new(),
            };
            w.nodes[CLIENT].on_message(w.now_us, addr(1), 101, 1, Body::Heartbeat(hb));
            let o = memlend_wire::ctrl::Offer {
                available_bytes: 1 << 30,
                data_addr: addr(1),
                next_offer_ms: 60_000,
            };
            w.nodes[CLIENT].on_message(w.now_us, addr(1), 101, 1, Body::Offer(o));
        }
        for i in 0..3 {
            w.drain(i);
        }
        // One round of heartbeats: everyone knows everyone's class.
        for i in 0..3 {
            w.nodes[i].tick(w.now_us);
            w.drain(i);
        }
        w.nodes[CLIENT].want(w.now_us, 1, 256 * MIB);
        w.drain(CLIENT);
        w
    }

    fn drain(&mut self, i: usize) {
        let mut heartbeats = Vec::new();
        while let Some(o) = self.nodes[i].poll_output() {
            match o {
                Output::Send { body: Body::Heartbeat(hb), .. } => heartbeats.push(hb),
                Output::Send { to: Dest::Broadcast, body } => {
                    for j in (0..3).filter(|&j| j != i) {
                        self.flight.push((i, j, body.clone()));
                    }
                }
                Output::Send { to: Dest::To(a), body } => {
                    let j = (0..3).find(|&j| addr(j) == a).expect("known address");
                    self.flight.push((i, j, body));
                }
                Output::Event(Event::Reserve { lease, bytes, .. }) => {
                    assert!(self.reserved[i].insert(lease, bytes).is_none(), "reserved twice");
                }
                Output::Event(Event::Unreserve { lease, .. }) => {
                    assert!(self.reserved[i].remove(&lease).is_some(), "unreserve without reserve");
                }
                Output::Event(Event::LeaseReady { .. } | Event::DemandUnmet { .. }) => {
                    self.answered += 1
                }
                Output::Event(_) => {}
            }
        }
        for hb in heartbeats {
            for j in (0..3).filter(|&j| j != i) {
                self.nodes[j].on_message(
                    self.now_us,
                    addr(i),
                    100 + i as u64,
                    1,
                    Body::Heartbeat(hb.clone()),
                );
                self.drain(j);
            }
        }
    }

    fn steps(&self) -> Vec<Step> {
        let mut v = vec![Step::Tick];
        for i in 0..self.flight.len() {
            v.push(Step::Deliver(i));
            if self.drops_left > 0 {
                v.push(Step::Drop(i));
            }
            if self.dups_left > 0 {
                v.push(Step::Dup(i));
            }
        }
        v
    }

    fn apply(&mut self, s: Step) {
        match s {
            Step::Deliver(k) => {
                let (from, to, body) = self.flight.remove(k);
                self.nodes[to].on_message(self.now_us, addr(from), 100 + from as u64, 1, body);
                self.drain(to);
            }
            Step::Drop(k) => {
                self.flight.remove(k);
                self.drops_left -= 1;
            }
            Step::Dup(k) => {
                let m = self.flight[k].clone();
                self.flight.push(m);
                self.dups_left -= 1;
            }
            Step::Tick => {
                let next =
                    self.nodes.iter().map(|n| n.next_deadline_us()).min().unwrap_or(self.now_us);
                self.now_us = next.max(self.now_us + 1);
                for i in 0..3 {
                    self.nodes[i].tick(self.now_us);
                    self.drain(i);
                }
            }
        }
    }

    fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for n in &self.nodes {
            format!(
                "{:?}{:?}{:?}",
                n.lent().collect::<Vec<_>>(),
                n.borrowed().collect::<Vec<_>>(),
                n.demands().collect::<Vec<_>>()
            )
            .hash(&mut h);
        }
        let mut flight: Vec<String> = self.flight.iter().map(|m| format!("{m:?}")).collect();
        flight.sort();
        (flight, self.now_us, self.drops_left, self.dups_left, self.answered).hash(&mut h);
        h.finish()
    }

    /// Safety, at every state.
    fn check_safety(&self) {
        let client = &self.nodes[CLIENT];
        let mut requests = HashSet::new();
        for b in client.borrowed() {
            assert!(requests.insert(b.request_id), "one request bound twice");
            if b.state != BorrowedState::Binding {
                let donor = &self.nodes[(b.donor - 100) as usize];
                let l = donor
                    .lent()
                    .find(|l| l.lease == b.lease)
                    .expect("client holds a lease its donor does not");
                assert!(!matches!(l.state, LentState::Granted { .. }), "client bound, donor not");
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let lent: BTreeMap<LeaseId, u64> = n.lent().map(|l| (l.lease, l.bytes)).collect();
            assert_eq!(lent, self.reserved[i], "node {i}: data plane vs engine");
            assert!(n.lent_bytes() <= 1 << 30);
        }
    }

    /// From here, no more faults: everything settles, nothing is stranded.
    fn check_settles(mut self) {
        // Quiet, then long enough for the stranded-lease net to act.
        let mut quiet_since = None;
        for _ in 0..10_000 {
            if !self.flight.is_empty() {
                self.apply(Step::Deliver(0));
            } else if self.busy() || quiet_since.is_none_or(|t| self.now_us < t + 2 * 3_000_000) {
                quiet_since = quiet_since.or((!self.busy()).then_some(self.now_us));
                self.apply(Step::Tick);
            } else {
                break;
            }
            self.check_safety();
        }
        assert!(!self.busy() && self.flight.is_empty(), "did not settle");
        assert!(self.answered >= 1, "the demand was never answered");
        let held: BTreeMap<LeaseId, u64> =
            self.nodes[CLIENT].borrowed().map(|b| (b.lease, b.bytes)).collect();
        let lent: BTreeMap<LeaseId, u64> =
            self.nodes[1..].iter().flat_map(|n| n.lent().map(|l| (l.lease, l.bytes))).collect();
        // Lease ids are per donor; with two donors compare per donor.
        for d in 1..3 {
            let donor_id = 100 + d as u64;
            let held_d: BTreeMap<LeaseId, u64> = self.nodes[CLIENT]
                .borrowed()
                .filter(|b| b.donor == donor_id)
                .map(|b| (b.lease, b.bytes))
                .collect();
            let lent_d: BTreeMap<LeaseId, u64> =
                self.nodes[d].lent().map(|l| (l.lease, l.bytes)).collect();
            assert_eq!(held_d, lent_d, "donor {d}: stranded or lost lease");
        }
        assert!(held.values().sum::<u64>() <= 256 * MIB && lent.values().sum::<u64>() <= 256 * MIB);
    }

    fn busy(&self) -> bool {
        self.nodes.iter().any(|n| {
            n.demands().next().is_some()
                || n.borrowed().any(|b| b.state == BorrowedState::Binding)
                || n.lent().any(|l| matches!(l.state, LentState::Granted { .. }))
        })
    }
}

fn explore(four_way: bool, depth: usize) -> usize {
    let mut seen = HashSet::new();
    let mut stack = vec![(World::new(four_way), Vec::new())];
    while let Some((w, path)) = stack.pop() {
        if !seen.insert(w.fingerprint()) {
            continue;
        }
        let trace = || format!("{path:?}");
        let run = std::panic::AssertUnwindSafe(|| {
            w.check_safety();
            if path.len() == depth {
                w.clone().check_settles();
            }
        });
        if let Err(e) = std::panic::catch_unwind(run) {
            eprintln!("counterexample: {}", trace());
            std::panic::resume_unwind(e);
        }
        if path.len() == depth {
            continue;
        }
        for s in w.steps() {
            let mut next = w.clone();
            let msg = next
                .flight
                .get(match s {
                    Step::Deliver(k) | Step::Drop(k) | Step::Dup(k) => k,
                    Step::Tick => usize::MAX,
                })
                .map(|m| format!("{}->{} {:?}", m.0, m.1, m.2));
            next.apply(s);
            let mut p = path.clone();
            p.push(format!("{s:?} {}", msg.unwrap_or_else(|| format!("t={}", next.now_us))));
            stack.push((next, p));
        }
    }
    seen.len()
}

#[test]
fn three_way_handshake_every_interleaving() {
    let states = explore(false, 10);
    eprintln!("3-way: {states} distinct states explored");
    assert!(states > 1_000);
}

#[test]
fn four_way_handshake_every_interleaving() {
    let w = World::new(true);
    let requests: Vec<usize> =
        w.flight.iter().filter(|m| matches!(m.2, Body::Request(_))).map(|m| m.1).collect();
    assert_eq!(requests, vec![1], "the request goes unicast to the one offering server");
    let states = explore(true, 10);
    eprintln!("4-way: {states} distinct states explored");
    assert!(states > 100);
}
