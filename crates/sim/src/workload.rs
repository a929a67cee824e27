//! Memory traces, one per node: how much memory its own work wants at each
//! moment. Lenders use little and steadily. Workers follow a compressed
//! diurnal wave (a "day" of one to four minutes) with heavy-tailed bursts of
//! jobs on top, so they lend in their troughs and borrow at their peaks,
//! and demand for remote memory comes and goes.

use crate::rng::Rng;

const GIB: u64 = 1 << 30;
/// Most bursts one node's trace holds (the Poisson draw stops there).
pub const BURSTS_MAX: usize = 256;
/// Mean gap between a worker's bursts, in seconds.
const BURST_GAP_S: f64 = 30.0;

#[derive(Clone, Debug)]
struct Burst {
    start_ms: u64,
    end_ms: u64,
    bytes: u64,
}

#[derive(Clone, Debug)]
pub struct Trace {
    pub total_bytes: u64,
    base_frac: f64,
    wave_amp_frac: f64,
    wave_period_ms: f64,
    wave_phase: f64,
    bursts: Vec<Burst>,
    /// A scripted node's jobs are far memory wanted on top of its use
    /// (`scenario.rs`), not working sets that may or may not fit.
    jobs_are_remote: bool,
}

impl Trace {
    pub fn generate(rng: &mut Rng, lender: bool, seconds: u64) -> Trace {
        let total_bytes = [16, 32, 64][rng.below(3) as usize] * GIB;
        let wave_period_ms = rng.range(60_000.0, 240_000.0);
        let wave_phase = rng.range(0.0, std::f64::consts::TAU);
        if lender {
            return Trace {
                total_bytes,
                base_frac: rng.range(0.15, 0.30),
                wave_amp_frac: 0.02,
                wave_period_ms,
                wave_phase,
                bursts: Vec::new(),
                jobs_are_remote: false,
            };
        }
        let base_frac = rng.range(0.45, 0.75);
        let wave_amp_frac = rng.range(0.10, 0.35);
        let bursts = bursts(rng, total_bytes, seconds);
        Trace {
            total_bytes,
            base_frac,
            wave_amp_frac,
            wave_period_ms,
            wave_phase,
            bursts,
            jobs_are_remote: false,
        }
    }

    /// A node of a scenario: steady use, and jobs that want far memory.
    pub fn scripted(n: &crate::scenario::NodeScript) -> Trace {
        const MIB: u64 = 1 << 20;
        let total_bytes = n.memory_mib * MIB;
        let bursts = n
            .jobs
            .iter()
            .map(|j| Burst {
                start_ms: j.start_s * 1_000,
                end_ms: j.end_s * 1_000,
                bytes: j.far_mib * MIB,
            })
            .collect();
        Trace {
            total_bytes,
            base_frac: n.used_mib as f64 / n.memory_mib as f64,
            wave_amp_frac: 0.0,
            wave_period_ms: 1.0,
            wave_phase: 0.0,
            bursts,
            jobs_are_remote: true,
        }
    }

    /// What the node's work wants now, local or not.
    pub fn working_set_bytes(&self, now_ms: u64) -> u64 {
        let angle = self.wave_phase + std::f64::consts::TAU * now_ms as f64 / self.wave_period_ms;
        let frac = (self.base_frac + self.wave_amp_frac * angle.sin()).max(0.01);
        (frac * self.total_bytes as f64) as u64 + self.jobs_bytes(now_ms)
    }

    fn jobs_bytes(&self, now_ms: u64) -> u64 {
        let running = self.bursts.iter().filter(|b| b.start_ms <= now_ms && now_ms < b.end_ms);
        running.map(|b| b.bytes).sum()
    }

    /// (local use, remote need): use is capped at the node's memory; what
    /// does not fit must be borrowed.
    pub fn used_and_need(&self, now_ms: u64) -> (u64, u64) {
        if self.jobs_are_remote {
            let used = (self.base_frac * self.total_bytes as f64) as u64;
            return (used, self.jobs_bytes(now_ms));
        }
        let ws = self.working_set_bytes(now_ms);
        (ws.min(self.total_bytes), ws.saturating_sub(self.total_bytes))
    }
}

/// Jobs arriving as a Poisson process, sizes Pareto (alpha 1.5) from 5% of
/// the node's memory, capped at its whole memory; each lasts 5 to 30 s.
fn bursts(rng: &mut Rng, total_bytes: u64, seconds: u64) -> Vec<Burst> {
    let mut v = Vec::new();
    let mut t_ms = rng.exp(BURST_GAP_S * 1_000.0);
    while (t_ms as u64) < seconds * 1_000 && v.len() < BURSTS_MAX {
        let frac = rng.pareto(0.05, 1.5).min(1.0);
        let start_ms = t_ms as u64;
        v.push(Burst {
            start_ms,
            end_ms: start_ms + rng.range(5_000.0, 30_000.0) as u64,
            bytes: (frac * total_bytes as f64) as u64,
        });
        t_ms += rng.exp(BURST_GAP_S * 1_000.0);
    }
    v
}
