//! A simulated cluster for engine tests: engines, a clock, and a network
//! that can lose, duplicate, delay and reorder datagrams, all seeded.

#![allow(dead_code)]

use memlend_pool::engine::{Config, Dest, Engine, Event, Output, Status};
use memlend_pool::select::FirstCome;
use memlend_wire::ctrl::{Body, LeaseId, NodeClass};
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

pub struct Node {
    pub engine: Engine,
    pub addr: SocketAddr,
    pub incarnation: u64,
    pub up: bool,
    /// What the data plane would accept: lease -> bytes.
    pub reserved: BTreeMap<LeaseId, u64>,
    pub events: Vec<Event>,
}

pub struct Packet {
    pub from: usize,
    pub to: usize,
    pub at_us: u64,
    pub body: Body,
}

pub struct Net {
    pub nodes: Vec<Node>,
    pub now_us: u64,
    pub flight: Vec<Packet>,
    pub loss: f64,
    pub dup: f64,
    pub delay_us: u64,
    pub jitter_us: u64,
    pub seed: u64,
    pub sent: Vec<(u64, usize, Body, bool)>,
}

pub fn config(i: usize) -> Config {
    let mut c = Config::new(100 + i as u64, &format!("n{i}"), data_addr(i), [i as u8; 32]);
    c.heartbeat_ms = 100;
    c
}

pub fn data_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7070))
}

pub fn ctrl_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7071))
}

pub fn status(class: NodeClass, lendable_bytes: u64) -> Status {
    Status { class, total_bytes: 8 * GIB, used_bytes: 2 * GIB, lendable_bytes }
}

impl Net {
    pub fn new(n: usize) -> Net {
        Net::with(n, config)
    }

    pub fn with(n: usize, cfg: impl Fn(usize) -> Config) -> Net {
        Net::with_selector(n, cfg, memlend_pool::select::SelectorKind::FirstCome)
    }

    /// Every engine choosing among grants by `kind`.
    pub fn with_selector(
        n: usize,
        cfg: impl Fn(usize) -> Config,
        kind: memlend_pool::select::SelectorKind,
    ) -> Net {
        let nodes = (0..n)
            .map(|i| Node {
                engine: Engine::new(cfg(i), memlend_pool::select::make(kind)),
                addr: ctrl_addr(i),
                incarnation: 1,
                up: true,
                reserved: BTreeMap::new(),
                events: Vec::new(),
            })
            .collect();
        Net {
            nodes,
            now_us: 1_000,
            flight: Vec::new(),
            loss: 0.0,
            dup: 0.0,
            delay_us: 100,
            jitter_us: 0,
            seed: 1,
            sent: Vec::new(),
        }
    }

    fn rand(&mut self) -> f64 {
        // xorshift64*: deterministic per seed.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        (self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn set_status(&mut self, i: usize, s: Status) {
        let now = self.now_us;
        self.nodes[i].engine.set_status(now, s);
        self.drain(i);
    }

    pub fn want(&mut self, i: usize, owner: u64, bytes: u64) {
        self.want_avoiding(i, owner, bytes, &[]);
    }

    pub fn want_avoiding(&mut self, i: usize, owner: u64, bytes: u64, avoid: &[u64]) {
        let now = self.now_us;
        self.nodes[i].engine.want_avoiding(now, owner, bytes, avoid);
        self.drain(i);
    }

    /// Move node `i`'s outputs onto the wire and into its record.
    pub fn drain(&mut self, i: usize) {
        while let Some(o) = self.nodes[i].engine.poll_output() {
            match o {
                Output::Send { to, body } => self.transmit(i, to, body),
                Output::Event(e) => self.apply(i, e),
            }
        }
    }

    fn apply(&mut self, i: usize, e: Event) {
        let n = &mut self.nodes[i];
        match &e {
            Event::Reserve { lease, bytes, .. } => {
                assert!(n.reserved.insert(*lease, *bytes).is_none(), "lease reserved twice");
            }
            Event::Unreserve { lease, .. } => {
                assert!(n.reserved.remove(lease).is_some(), "unreserve of a lease not reserved");
            }
            _ => {}
        }
        n.events.push(e);
    }

    fn transmit(&mut self, from: usize, to: Dest, body: Body) {
        let targets: Vec<usize> = match to {
            Dest::Broadcast => (0..self.nodes.len()).filter(|&j| j != from).collect(),
            Dest::To(a) => self.nodes.iter().position(|n| n.addr == a).into_iter().collect(),
        };
        self.sent.push((self.now_us, from, body.clone(), to == Dest::Broadcast));
        for t in targets {
            let copies = if self.rand() < self.dup { 2 } else { 1 };
            for _ in 0..copies {
                if self.rand() < self.loss {
                    continue;
                }
                let at_us =
                    self.now_us + self.delay_us + (self.rand() * self.jitter_us as f64) as u64;
                self.flight.push(Packet { from, to: t, at_us, body: body.clone() });
            }
        }
    }

    /// Advance time by `us`, 100 µs at a time: deliver what is due (in
    /// arrival order, so jitter reorders), then run every engine's timers.
    pub fn run_for(&mut self, us: u64) {
        let end = self.now_us + us;
        while self.now_us < end {
            self.now_us += 100;
            self.deliver_due();
            for i in 0..self.nodes.len() {
                if self.nodes[i].up {
                    let now = self.now_us;
                    self.nodes[i].engine.tick(now);
                    self.drain(i);
                }
            }
        }
    }

    fn deliver_due(&mut self) {
        let now = self.now_us;
        let mut due: Vec<Packet> = Vec::new();
        let mut i = 0;
        while i < self.flight.len() {
            if self.flight[i].at_us <= now {
                due.push(self.flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| p.at_us);
        for p in due {
            if !self.nodes[p.to].up || !self.nodes[p.from].up {
                continue;
            }
            let (addr, node, inc) = {
                let f = &self.nodes[p.from];
                (f.addr, f.engine.config().node, f.incarnation)
            };
            self.nodes[p.to].engine.on_message(now, addr, node, inc, p.body);
            self.drain(p.to);
        }
    }

    /// A node crashes: it stops sending and receiving; its state is gone.
    pub fn crash(&mut self, i: usize) {
        self.nodes[i].up = false;
    }

    /// A crashed node starts again: new engine, higher incarnation.
    pub fn restart(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.engine = Engine::new(config(i), Box::new(FirstCome));
        n.incarnation += 1;
        n.up = true;
        n.reserved.clear();
    }

    pub fn ready(&self, i: usize) -> Vec<(u64, u64, u64, LeaseId)> {
        self.nodes[i]
            .events
            .iter()
            .filter_map(|e| match e {
                Event::LeaseReady { owner, lease } => {
                    Some((*owner, lease.donor, lease.bytes, lease.lease))
                }
                _ => None,
            })
            .collect()
    }

    pub fn count_events(&self, i: usize, f: impl Fn(&Event) -> bool) -> usize {
        self.nodes[i].events.iter().filter(|e| f(e)).count()
    }

    pub fn reserved_bytes(&self, i: usize) -> u64 {
        self.nodes[i].reserved.values().sum()
    }

    pub fn borrowed_bytes(&self, i: usize) -> u64 {
        self.nodes[i].engine.borrowed_bytes()
    }

    /// Every donor's reservations are exactly the leases live borrowers hold
    /// (active or being reclaimed) from it: nothing stranded, nothing lost.
    pub fn assert_consistent(&self) {
        for (d, donor) in self.nodes.iter().enumerate().filter(|(_, n)| n.up) {
            let id = donor.engine.config().node;
            let mut held: BTreeMap<LeaseId, u64> = BTreeMap::new();
            for b in self.nodes.iter().filter(|n| n.up) {
                for l in b.engine.borrowed().filter(|l| l.donor == id) {
                    held.insert(l.lease, l.bytes);
                }
            }
            assert_eq!(donor.reserved, held, "node {d}: reservations vs leases held");
        }
    }
}
