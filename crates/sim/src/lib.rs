//! A deterministic discrete-event simulator of the ACMS control plane: N
//! nodes, each running the real `memlend_pool` engine and classifier, on a
//! simulated clock and a seeded network. The same parameters give the same
//! run byte for byte (`Outcome::trace_hash` covers every datagram sent).
//!
//! `sim.rs` is the event loop, `finish.rs` the report at the end,
//! `node.rs` one node, `net.rs` the network, `partition.rs` a cut in it,
//! `workload.rs` the memory traces, `measure.rs` what is counted and
//! reported, `mirrors.rs` where mirrored borrows landed. `docs/scale.md`
//! says what it measured.

mod finish;
mod measure;
mod mirrors;
mod net;
mod node;
mod partition;
mod queue;
mod rng;
pub mod scenario;
mod sim;
mod workload;

pub use measure::{Cost, Outcome, Report};
pub use mirrors::MirrorOutcome;
pub use net::NetParams;
pub use partition::{Partition, PartitionOutcome, CHECK_AFTER_HEAL_S};
pub use queue::EVENTS_MAX;
/// Run one simulation to its end and report.
pub fn run(p: &Params) -> Result<Report, String> {
    p.check()?;
    let started = std::time::Instant::now();
    let sim = sim::simulate(p);
    Ok(finish::report(&sim, started.elapsed()))
}

/// Largest cluster simulated: node addresses are 10.x.y.z.
pub const NODES_MAX: usize = 1 << 20;
/// Longest run, simulated seconds.
pub const SECONDS_MAX: u64 = 24 * 3600;

#[derive(Clone, Debug)]
pub struct Params {
    pub nodes: usize,
    pub seconds: u64,
    pub seed: u64,
    pub net: NetParams,
    /// Share of nodes that only lend (low, steady use).
    pub lender_share: f64,
    /// Node crashes, each followed by a restart 2 to 10 s later.
    pub crashes: usize,
    /// Failure domains: node i sits in rack i mod `racks` (0: none named).
    pub racks: usize,
    /// Every borrower keeps two copies of what it borrows, each leg asking
    /// to avoid the other's donors (`--redundancy mirror`).
    pub mirror: bool,
    /// One network partition, healed before the end.
    pub partition: Option<Partition>,
    /// Scripted nodes instead of generated traces (`nodes` must match).
    pub scenario: Option<scenario::Scenario>,
    /// How every engine chooses among grants (the daemon's default: first come).
    pub selector: memlend_pool::select::SelectorKind,
    /// Seed lists instead of broadcast: nodes 0..seeds are everyone's seeds
    /// (0: one broadcast domain, the default).
    pub seeds: usize,
}

impl Params {
    pub fn new(nodes: usize, seconds: u64, seed: u64) -> Params {
        let net = NetParams::default();
        Params {
            nodes,
            seconds,
            seed,
            net,
            lender_share: 0.5,
            crashes: 0,
            racks: 0,
            mirror: false,
            partition: None,
            scenario: None,
            selector: memlend_pool::select::SelectorKind::FirstCome,
            seeds: 0,
        }
    }

    /// What each node's engine does beyond the daemon's defaults.
    pub fn setup(&self) -> node::Setup {
        node::Setup { racks: self.racks, selector: self.selector, seeds: self.seeds }
    }

    pub fn check(&self) -> Result<(), String> {
        if self.seeds > self.nodes {
            return Err(format!("{} seeds among {} nodes", self.seeds, self.nodes));
        }
        if !(2..=NODES_MAX).contains(&self.nodes) {
            return Err(format!("nodes must be 2 to {NODES_MAX}, got {}", self.nodes));
        }
        if !(1..=SECONDS_MAX).contains(&self.seconds) {
            return Err(format!("seconds must be 1 to {SECONDS_MAX}, got {}", self.seconds));
        }
        if self.racks > self.nodes {
            return Err(format!("racks must be at most the nodes, got {}", self.racks));
        }
        if let Some(s) = &self.scenario {
            s.check()?;
            if s.nodes.len() != self.nodes {
                let n = s.nodes.len();
                return Err(format!("the scenario has {n} nodes, the run {}", self.nodes));
            }
        }
        if let Some(cut) = &self.partition {
            cut.check(self.seconds)?;
        }
        let probs =
            [("loss", self.net.loss), ("dup", self.net.dup), ("lenders", self.lender_share)];
        for (what, p) in probs {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{what} must be in [0, 1], got {p}"));
            }
        }
        Ok(())
    }
}
