//! The ACMS classifier (section 4.2): server, neutral or client from the
//! node's own memory use, with guard bands and hold times so a node does not
//! oscillate, plus how much a server may lend.
//!
//! ```text
//!   used:  0 ---- LOW_MIN ---- HIGH_MIN ----- LOW_MAX ---- HIGH_MAX ---- 1
//!   enter server <|            |> leave server
//!                                   leave client <|          |> enter client
//! ```
//! Local far-memory demand also makes a node a client: memory its processes
//! borrow, or want and cannot get. A node that borrows does not lend. A
//! class change needs `confirm_samples` samples in a row and `hold_ms_min`
//! in the old class, except that a server whose use crosses HIGH_MAX leaves
//! at once (its own work comes first). The first offer comes with the
//! server class; after that it grows only after `quiet_samples` calm
//! samples in a row (Infiniswap's donor daemon), and shrinks at once.

use crate::monitor::Sample;
use memlend_wire::ctrl::NodeClass;
use std::str::FromStr;
use thiserror::Error;

/// PSI "some" avg10 (%) above which memory is under pressure: no growth of
/// the offer, no entering the server class.
pub const PSI_PRESSURE_PCT: f64 = 5.0;

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("thresholds must be 0 <= MEM_MIN_LOW < MEM_MIN_HIGH <= MEM_MAX_LOW < MEM_MAX_HIGH <= 1, got {0:?}")]
    Order([f64; 4]),
    #[error("thresholds are four fractions separated by commas, e.g. 0.40,0.50,0.75,0.85: {0}")]
    Syntax(String),
    #[error("smoothing alpha must be in (0, 1], got {0}")]
    Alpha(f64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    pub low_min: f64,
    pub high_min: f64,
    pub low_max: f64,
    pub high_max: f64,
}

impl Thresholds {
    pub fn new(
        low_min: f64,
        high_min: f64,
        low_max: f64,
        high_max: f64,
    ) -> Result<Thresholds, ConfigError> {
        let ok = 0.0 <= low_min
            && low_min < high_min
            && high_min <= low_max
            && low_max < high_max
            && high_max <= 1.0;
        if !ok {
            return Err(ConfigError::Order([low_min, high_min, low_max, high_max]));
        }
        Ok(Thresholds { low_min, high_min, low_max, high_max })
    }
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds { low_min: 0.40, high_min: 0.50, low_max: 0.75, high_max: 0.85 }
    }
}

impl FromStr for Thresholds {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Thresholds, ConfigError> {
        let v: Vec<f64> = s
            .split(',')
            .map(|p| p.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let [a, b, c, d] = v[..] else {
            return Err(ConfigError::Syntax(format!("{} values", v.len())));
        };
        Thresholds::new(a, b, c, d)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub hold_ms_min: u64,
    pub confirm_samples: u32,
    pub quiet_samples: u32,
    /// EWMA weight of the newest sample.
    pub alpha: f64,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { hold_ms_min: 5_000, confirm_samples: 2, quiet_samples: 3, alpha: 0.3 }
    }
}

/// The classifier's answer for one sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub class: NodeClass,
    pub changed: bool,
    /// What this node may lend in all now (leases included); 0 unless a server.
    pub lendable_bytes: u64,
    /// Lent beyond `lendable_bytes`: what to take back.
    pub reclaim_bytes: u64,
    pub used_fraction: f64,
}

#[derive(Clone, Debug)]
pub struct Classifier {
    th: Thresholds,
    timing: Timing,
    class: NodeClass,
    since_ms: u64,
    smoothed: Option<f64>,
    pending: Option<(NodeClass, u32)>,
    quiet: u32,
    offer_bytes: u64,
}

impl Classifier {
    pub fn new(th: Thresholds, timing: Timing) -> Result<Classifier, ConfigError> {
        if !(timing.alpha > 0.0 && timing.alpha <= 1.0) {
            return Err(ConfigError::Alpha(timing.alpha));
        }
        Ok(Classifier {
            th,
            timing,
            class: NodeClass::Neutral,
            since_ms: 0,
            smoothed: None,
            pending: None,
            quiet: 0,
            offer_bytes: 0,
        })
    }

    /// `s.used_bytes` is the node's own use: leave out what it holds for
    /// borrowers. `lent_bytes` is what its leases promise; `far_demand_bytes`
    /// what its processes borrow or still want.
    pub fn update(
        &mut self,
        now_ms: u64,
        s: &Sample,
        lent_bytes: u64,
        far_demand_bytes: u64,
    ) -> Verdict {
        let u = self.smooth(s.used_fraction());
        let pressure = s.psi_some_avg10.is_some_and(|p| p > PSI_PRESSURE_PCT);
        let target = self.target(u, far_demand_bytes > 0, pressure);
        let emergency = self.class == NodeClass::Server && u > self.th.high_max;
        let changed = self.consider(now_ms, target, emergency);
        let lendable_bytes = self.lendable(s, pressure, changed);
        Verdict {
            class: self.class,
            changed,
            lendable_bytes,
            reclaim_bytes: lent_bytes.saturating_sub(lendable_bytes),
            used_fraction: u,
        }
    }

    pub fn class(&self) -> NodeClass {
        self.class
    }

    fn smooth(&mut self, x: f64) -> f64 {
        let a = self.timing.alpha;
        let v = self.smoothed.map_or(x, |old| a * x + (1.0 - a) * old);
        self.smoothed = Some(v);
        v
    }

    /// The class the guard bands point to from the current one.
    fn target(&self, u: f64, demand: bool, pressure: bool) -> NodeClass {
        let th = &self.th;
        let fresh = || {
            if demand || u > th.high_max {
                NodeClass::Client
            } else if u < th.low_min && !pressure {
                NodeClass::Server
            } else {
                NodeClass::Neutral
            }
        };
        match self.class {
            NodeClass::Client if demand || u >= th.low_max => NodeClass::Client,
            NodeClass::Server if !demand && u <= th.high_min => NodeClass::Server,
            _ => fresh(),
        }
    }

    fn consider(&mut self, now_ms: u64, target: NodeClass, emergency: bool) -> bool {
        if target == self.class {
            self.pending = None;
            return false;
        }
        let count = match self.pending {
            Some((c, n)) if c == target => n + 1,
            _ => 1,
        };
        self.pending = Some((target, count));
        let held = now_ms.saturating_sub(self.since_ms) >= self.timing.hold_ms_min;
        if !emergency && (count < self.timing.confirm_samples || !held) {
            return false;
        }
        self.class = target;
        self.since_ms = now_ms;
        self.pending = None;
        self.quiet = 0;
        true
    }

    /// A server may lend so much that its own use plus everything lent stays
    /// under MEM_MIN_HIGH: then even fully used leases cannot push it out of
    /// the server band by themselves.
    ///
    /// The first offer comes with the class: becoming a server already took
    /// a sustained surplus (two samples under MEM_MIN_LOW after the hold).
    fn lendable(&mut self, s: &Sample, pressure: bool, changed: bool) -> u64 {
        if self.class != NodeClass::Server {
            self.offer_bytes = 0;
            self.quiet = 0;
            return 0;
        }
        let cap = ((s.total_bytes as f64 * self.th.high_min) as u64).saturating_sub(s.used_bytes);
        // A new server offers its whole cap; a smaller cap applies at once.
        if (changed && !pressure) || cap < self.offer_bytes {
            self.offer_bytes = cap;
            self.quiet = 0;
        } else if cap > self.offer_bytes && !pressure {
            self.quiet += 1;
            if self.quiet >= self.timing.quiet_samples {
                self.offer_bytes = cap;
                self.quiet = 0;
            }
        } else {
            self.quiet = 0;
        }
        self.offer_bytes
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
