//! The event loop: pop the earliest event, hand it to the node's engine or
//! classifier, carry out what the engine outputs (as `memlendd`'s control
//! loop does: datagrams encoded with the real codec, events to the local
//! borrower agent), and schedule what follows.

use crate::measure::{Counters, WARMUP_S};
use crate::net::Datagram;
use crate::node::{ctrl_addr, index_of, SimNode, OWNER, OWNER_B};
use crate::queue::Queue;
use crate::rng::Rng;
use crate::workload::Trace;
use crate::Params;
use memlend_pool::engine::{kind, BorrowedState, Dest, Event, Output, Status, WANT_BYTES_MAX};
use memlend_pool::monitor::Sample;
use memlend_wire::ctrl::{self, Body, CtrlKey, Envelope, LeaseId, NodeId, DATAGRAM_BYTES_MAX};
use std::rc::Rc;

const S_US: u64 = 1_000_000;
/// After a tick the daemon's poll waits at least 1 ms (unless a datagram
/// wakes it): the same floor here also guarantees that time moves on.
const POLL_US_MIN: u64 = 1_000;
/// A reclaimed lease's pages move away at this rate (plus the floor).
const MIGRATE_BYTES_PER_S: f64 = 1e9;
const MIGRATE_FLOOR_US: u64 = 10_000;

pub(crate) enum Ev {
    Deliver {
        to: u32,
        dg: Rc<Datagram>,
    },
    Tick {
        node: u32,
        inc: u64,
    },
    Sample {
        node: u32,
        inc: u64,
    },
    Migrate {
        node: u32,
        inc: u64,
        donor: NodeId,
        lease: LeaseId,
    },
    Boot {
        node: u32,
    },
    Crash {
        node: u32,
    },
    Restart {
        node: u32,
    },
    Oracle,
    /// `CHECK_AFTER_HEAL_S` after a partition healed: count stranded leases.
    HealCheck,
}

pub(crate) struct Sim {
    pub p: Params,
    pub now_us: u64,
    pub nodes: Vec<SimNode>,
    pub queue: Queue<Ev>,
    pub rng: Rng,
    key: CtrlKey,
    cluster_id: u64,
    pub m: Counters,
    /// Each node's failure domain by id, to judge where mirrors landed.
    domains: std::collections::HashMap<NodeId, String>,
}

/// Run one simulation (of checked parameters) to its end.
pub(crate) fn simulate(p: &Params) -> Sim {
    let mut sim = Sim::new(p.clone());
    let end_us = p.seconds * S_US;
    // Bounded: every event lies at or after the current time, deliveries
    // at least 1 µs later, ticks after a tick at least POLL_US_MIN later.
    while let Some((at_us, ev)) = sim.queue.pop() {
        if at_us > end_us {
            break;
        }
        sim.now_us = at_us;
        sim.m.events += 1;
        sim.handle(ev);
    }
    sim.now_us = end_us;
    sim
}

impl Sim {
    fn new(p: Params) -> Sim {
        let mut rng = Rng::new(p.seed);
        let mut key_bytes = [0u8; 32];
        for c in key_bytes.chunks_mut(8) {
            c.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        let lenders = (p.nodes as f64 * p.lender_share).round() as usize;
        let nodes: Vec<SimNode> = (0..p.nodes)
            .map(|i| {
                let mut fork = rng.fork();
                let trace = match &p.scenario {
                    Some(s) => Trace::scripted(&s.nodes[i]),
                    None => Trace::generate(&mut fork, i < lenders, p.seconds),
                };
                SimNode::new(i as u32, trace, &mut rng, p.setup())
            })
            .collect();
        let domains = nodes.iter().map(|n| (n.id, n.domain.clone())).collect();
        let mut sim = Sim {
            now_us: 0,
            queue: Queue::new(16 * p.nodes + 1024),
            key: CtrlKey::new(&key_bytes),
            cluster_id: ctrl::cluster_id_from_key(&key_bytes),
            m: Counters::new(),
            nodes,
            domains,
            rng,
            p,
        };
        sim.schedule_start();
        sim
    }

    /// Nodes boot at random moments in the first second (a node hears
    /// nothing before it boots); crashes at random moments between 10% and
    /// 70% of the run.
    fn schedule_start(&mut self) {
        for node in 0..self.nodes.len() as u32 {
            let boot_us = self.rng.below(S_US);
            self.queue.push_timer(boot_us, Ev::Boot { node });
        }
        self.queue.push_timer(S_US, Ev::Oracle);
        if let Some(cut) = self.p.partition {
            let at_us = (cut.heal_s + crate::partition::CHECK_AFTER_HEAL_S) * S_US;
            self.queue.push_timer(at_us, Ev::HealCheck);
        }
        let run_us = self.p.seconds * S_US;
        for _ in 0..self.p.crashes {
            let node = self.rng.below(self.nodes.len() as u64) as u32;
            let at_us = (self.rng.range(0.1, 0.7) * run_us as f64) as u64;
            let down_us = (self.rng.range(2.0, 10.0) * S_US as f64) as u64;
            self.queue.push_timer(at_us, Ev::Crash { node });
            self.queue.push_timer(at_us + down_us, Ev::Restart { node });
        }
    }

    fn boot(&mut self, i: u32, at_us: u64) {
        let n = &mut self.nodes[i as usize];
        n.tick_at_us = at_us;
        let inc = n.incarnation;
        self.queue.push_timer(at_us, Ev::Tick { node: i, inc });
        self.queue.push_timer(at_us, Ev::Sample { node: i, inc });
    }

    fn live(&self, node: u32, inc: u64) -> bool {
        let n = &self.nodes[node as usize];
        n.up && n.incarnation == inc
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { to, dg } => self.deliver(to, &dg),
            Ev::Tick { node, inc } if self.live(node, inc) => self.tick(node),
            Ev::Sample { node, inc } if self.live(node, inc) => {
                self.sample(node);
                self.queue.push_timer(self.now_us + S_US, Ev::Sample { node, inc });
            }
            Ev::Migrate { node, inc, donor, lease } if self.live(node, inc) => {
                self.nodes[node as usize].engine.release(self.now_us, donor, lease);
                self.drain(node);
                self.schedule_tick(node, false);
            }
            // Guarded: a crash scheduled before boot (very short runs) is
            // ignored and its restart has booted the node already.
            Ev::Boot { node } if !self.nodes[node as usize].up => {
                self.nodes[node as usize].up = true;
                self.boot(node, self.now_us);
            }
            Ev::Crash { node } if self.nodes[node as usize].up => {
                self.nodes[node as usize].crash();
                self.m.crashes += 1;
            }
            Ev::Restart { node } if !self.nodes[node as usize].up => {
                self.nodes[node as usize].restart(&mut self.rng);
                let at_us = self.now_us;
                self.boot(node, at_us);
            }
            Ev::Oracle => {
                if self.now_us >= WARMUP_S * S_US {
                    self.oracle();
                }
                self.queue.push_timer(self.now_us + S_US, Ev::Oracle);
            }
            Ev::HealCheck => {
                let (stranded, leases) = crate::node::stranded(&self.nodes);
                self.m.partition.stranded_after_heal = stranded;
                self.m.partition.leases_after_heal = leases;
            }
            _ => {} // a timer of a crashed incarnation, or a no-op crash
        }
    }

    fn tick(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        if n.tick_at_us != self.now_us {
            return; // superseded by an earlier tick
        }
        n.tick_at_us = u64::MAX;
        n.engine.tick(self.now_us);
        self.drain(i);
        self.schedule_tick(i, true);
    }

    /// Queue a tick at the engine's next deadline unless one is queued
    /// sooner. A later tick already queued is left to be skipped.
    fn schedule_tick(&mut self, i: u32, after_tick: bool) {
        let now = self.now_us;
        let n = &mut self.nodes[i as usize];
        let floor_us = if after_tick { now + POLL_US_MIN } else { now };
        let at_us = n.engine.next_deadline_us().max(floor_us);
        if at_us < n.tick_at_us {
            n.tick_at_us = at_us;
            let inc = n.incarnation;
            self.queue.push_timer(at_us, Ev::Tick { node: i, inc });
        }
    }

    fn deliver(&mut self, to: u32, dg: &Datagram) {
        let now = self.now_us;
        let n = &mut self.nodes[to as usize];
        if !n.up {
            self.m.dropped_down += 1;
            return;
        }
        self.m.msgs_recv += 1;
        self.m.bytes_recv += u64::from(dg.bytes);
        if now >= WARMUP_S * S_US {
            self.m.bytes_recv_warm += u64::from(dg.bytes);
        }
        if n.replay.check_and_record(dg.sender, dg.incarnation, dg.counter).is_err() {
            self.m.replays_refused += 1;
            return;
        }
        // A heartbeat changes the engine's deadlines only through outputs
        // or a peer's class or liveness (which group broadcasts offers);
        // skipping the O(peers) deadline scan otherwise keeps N = 1000
        // affordable.
        let heartbeat = matches!(dg.body, Body::Heartbeat(_));
        let view = |n: &SimNode| n.engine.members().get(dg.sender).map(|p| (p.class, p.suspect));
        let before = view(n);
        n.engine.on_message(now, ctrl_addr(dg.from), dg.sender, dg.incarnation, dg.body.clone());
        let changed = view(&self.nodes[to as usize]) != before;
        let emitted = self.drain(to);
        if !heartbeat || emitted || changed {
            self.schedule_tick(to, false);
        }
    }

    /// The daemon's once-a-second sample: the borrower agent adjusts its
    /// demand, then the classifier sees use and demand, as
    /// `memlendd::cluster::control::sample` feeds it.
    fn sample(&mut self, i: u32) {
        let now = self.now_us;
        let (used, need) = self.nodes[i as usize].trace.used_and_need(now / 1_000);
        self.agent(i, need);
        let n = &mut self.nodes[i as usize];
        let lent = n.engine.lent_bytes();
        let demand = n.engine.unmet_demand_bytes() + n.engine.borrowed_bytes();
        let total = n.trace.total_bytes;
        let s = Sample {
            total_bytes: total,
            used_bytes: used,
            psi_some_avg10: None,
            psi_full_avg10: None,
        };
        let v = n.classifier.update(now / 1_000, &s, lent, demand);
        let status = Status {
            class: v.class,
            total_bytes: total,
            used_bytes: used,
            lendable_bytes: v.lendable_bytes,
        };
        n.engine.set_status(now, status);
        self.drain(i);
        self.schedule_tick(i, false);
    }

    /// The borrower side of a node's processes (what `borrow`'s lease agent
    /// does): ask for what is needed and not held or asked for; give back
    /// whole leases the need no longer covers.
    fn agent(&mut self, i: u32, need: u64) {
        let now = self.now_us;
        if self.p.mirror {
            // Each leg avoids the other's donors, as `borrow` does, and
            // asks only while the other has no ask open: two open asks
            // could each be granted by the same donor (`borrow` asks for
            // the second leg once the first is leased).
            let e = &self.nodes[i as usize].engine;
            if e.unmet_demand_bytes_of(OWNER_B) == 0 {
                self.leg(i, OWNER, need, OWNER_B);
            }
            let e = &self.nodes[i as usize].engine;
            if e.unmet_demand_bytes_of(OWNER) == 0 {
                self.leg(i, OWNER_B, need, OWNER);
            }
        } else {
            self.leg(i, OWNER, need, OWNER);
        }
        let copies = self.copies();
        let n = &mut self.nodes[i as usize];
        n.need_bytes = need * copies;
        let short = n.need_bytes > n.active_borrowed_bytes();
        match (short, n.demand_since_us) {
            (true, None) => n.demand_since_us = Some(now),
            (false, Some(_)) => {
                n.demand_since_us = None;
                self.m.episodes_withdrawn += 1;
            }
            _ => {}
        }
        self.drain(i);
    }

    /// Copies of each borrowed byte.
    pub(crate) fn copies(&self) -> u64 {
        if self.p.mirror {
            2
        } else {
            1
        }
    }

    /// One owner's leases toward `need`, away from `other`'s donors when
    /// that is another owner.
    fn leg(&mut self, i: u32, owner: u64, need: u64, other: u64) {
        let now = self.now_us;
        let n = &mut self.nodes[i as usize];
        let held = n.held_bytes_of(owner);
        let asked = held + n.engine.unmet_demand_bytes_of(owner);
        if need > asked {
            let avoid = if other == owner { Vec::new() } else { n.donors_of(other) };
            n.engine.want_avoiding(now, owner, (need - asked).min(WANT_BYTES_MAX), &avoid);
        } else if held > need {
            let mut surplus = held - need;
            let mut leases: Vec<(u64, NodeId, LeaseId)> = n
                .engine
                .borrowed()
                .filter(|b| b.owner == owner && b.state == BorrowedState::Active)
                .map(|b| (b.bytes, b.donor, b.lease))
                .collect();
            leases.sort_unstable_by(|a, b| b.cmp(a));
            for (bytes, donor, lease) in leases {
                if bytes <= surplus {
                    surplus -= bytes;
                    n.engine.release(now, donor, lease);
                }
            }
        }
    }

    /// Carry out the engine's outputs; true if there were any.
    fn drain(&mut self, i: u32) -> bool {
        let mut any = false;
        while let Some(o) = self.nodes[i as usize].engine.poll_output() {
            any = true;
            match o {
                Output::Send { to, body } => self.transmit(i, to, body),
                Output::Event(e) => self.event(i, e),
            }
        }
        any
    }

    fn event(&mut self, i: u32, e: Event) {
        let now = self.now_us;
        let n = &mut self.nodes[i as usize];
        match e {
            Event::LeaseReady { owner, .. } => {
                if let Some(since) = n.demand_since_us {
                    if n.active_borrowed_bytes() >= n.need_bytes {
                        n.demand_since_us = None;
                        self.m.latency(now - since);
                    }
                }
                // One leg leased: the other may ask now, as `borrow` does.
                let other = if owner == OWNER { OWNER_B } else { OWNER };
                if self.p.mirror && n.engine.unmet_demand_bytes_of(owner) == 0 {
                    let need = n.need_bytes / 2;
                    self.leg(i, other, need, owner);
                }
            }
            Event::ReclaimRequested { donor, lease, .. } => {
                let bytes = n
                    .engine
                    .borrowed()
                    .find(|b| b.donor == donor && b.lease == lease)
                    .map_or(0, |b| b.bytes);
                let move_us = (bytes as f64 / MIGRATE_BYTES_PER_S * 1e6) as u64;
                let inc = n.incarnation;
                let ev = Ev::Migrate { node: i, inc, donor, lease };
                self.queue.push_timer(now + MIGRATE_FLOOR_US + move_us, ev);
            }
            // The data plane (reservations) is not simulated; a lost lease
            // or unmet demand is asked for again at the next sample.
            _ => {}
        }
    }

    /// Number, encode and sign the datagram as the daemon's transport does
    /// (its size is what is counted), then put a copy on the way to each
    /// receiver.
    fn transmit(&mut self, i: u32, to: Dest, body: Body) {
        let n = &mut self.nodes[i as usize];
        n.counter += 1;
        let env = Envelope {
            cluster_id: self.cluster_id,
            sender: n.id,
            incarnation: n.incarnation,
            counter: n.counter,
            body,
        };
        let mut buf = [0u8; DATAGRAM_BYTES_MAX];
        let len = ctrl::encode(&env, &self.key, &mut buf).expect("engine messages always encode");
        self.m.hash(self.now_us, &buf[..len]);
        self.m.msgs_sent += 1;
        self.m.bytes_sent += len as u64;
        if self.now_us >= WARMUP_S * S_US {
            self.m.bytes_sent_warm += len as u64;
        }
        self.m.bytes_sent_by_kind[kind(&env.body)] += len as u64;
        let dg = Rc::new(Datagram {
            from: i,
            sender: env.sender,
            incarnation: env.incarnation,
            counter: env.counter,
            bytes: len as u32,
            body: env.body,
        });
        match to {
            Dest::Broadcast => {
                for j in (0..self.nodes.len() as u32).filter(|&j| j != i) {
                    self.route(j, &dg);
                }
            }
            Dest::To(addr) => match index_of(addr) {
                Some(j) if (j as usize) < self.nodes.len() => self.route(j, &dg),
                _ => self.m.lost += 1, // no such node: nobody receives it
            },
        }
    }

    fn route(&mut self, to: u32, dg: &Rc<Datagram>) {
        let now_s = self.now_us / S_US;
        if self.p.partition.is_some_and(|c| c.cuts(self.nodes.len(), now_s, dg.from, to)) {
            self.m.partition.dropped += 1;
            return;
        }
        let copies = self.p.net.copies(&mut self.rng);
        match copies {
            0 => self.m.lost += 1,
            2 => self.m.duplicated += 1,
            _ => {}
        }
        for _ in 0..copies {
            let at_us = self.now_us + self.p.net.delay_us(&mut self.rng);
            self.queue.push_datagram(at_us, Ev::Deliver { to, dg: Rc::clone(dg) });
        }
    }

    /// Once a second: what the cluster borrows usefully, against the
    /// lesser of what lenders could lend and what borrowers need.
    fn oracle(&mut self) {
        let now_ms = self.now_us / 1_000;
        let high_min = memlend_pool::classify::Thresholds::default().high_min;
        let (mut spare, mut need, mut useful, mut lent) = (0u64, 0u64, 0u64, 0u64);
        for n in self.nodes.iter().filter(|n| n.up) {
            let (used, want) = n.trace.used_and_need(now_ms);
            if want == 0 {
                let cap = (n.trace.total_bytes as f64 * high_min) as u64;
                spare += cap.saturating_sub(used);
            }
            need += want;
            useful += want.min(n.active_borrowed_bytes() / self.copies());
            lent += n.engine.lent_bytes();
            if self.p.mirror && self.now_us >= WARMUP_S * S_US {
                self.m.mirrors.add(n, &self.domains);
            }
        }
        self.m.oracle_sum += spare.min(need) as f64;
        self.m.harvest_sum += useful as f64;
        self.m.lent_sum += lent as f64;
        self.m.harvest_samples += 1;
    }
}
