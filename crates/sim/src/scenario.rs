//! A scripted scenario instead of generated traces: for each node its
//! memory, what its own work uses, and the far-memory jobs it runs (how
//! many bytes it wants from the cluster, from when to when). The same file
//! can drive a lab of real daemons (balloons for the use, `memlend far
//! --pool` for the jobs), so the two can be compared.
//!
//! ```json
//! {"nodes": [
//!   {"memory_mib": 256, "used_mib": 60},
//!   {"memory_mib": 256, "used_mib": 200,
//!    "jobs": [{"start_s": 15, "end_s": 45, "far_mib": 64}]}
//! ]}
//! ```

use serde::Deserialize;

/// Most jobs one node's script holds.
pub const JOBS_MAX: usize = 1024;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub nodes: Vec<NodeScript>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeScript {
    pub memory_mib: u64,
    /// What the node's own work uses, all the time.
    pub used_mib: u64,
    #[serde(default)]
    pub jobs: Vec<Job>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub start_s: u64,
    pub end_s: u64,
    /// Bytes the job wants from the cluster while it runs, MiB.
    pub far_mib: u64,
}

impl Scenario {
    /// Parse and check a scenario's JSON.
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = serde_json::from_str(text).map_err(|e| format!("scenario: {e}"))?;
        s.check()?;
        Ok(s)
    }

    pub fn check(&self) -> Result<(), String> {
        for (i, n) in self.nodes.iter().enumerate() {
            let at = |what: String| Err(format!("scenario node {i}: {what}"));
            if n.memory_mib == 0 || n.memory_mib > 1 << 30 {
                return at(format!("memory_mib {} is not 1 MiB to 1 PiB", n.memory_mib));
            }
            if n.used_mib > n.memory_mib {
                return at(format!("uses {} MiB of {} MiB", n.used_mib, n.memory_mib));
            }
            if n.jobs.len() > JOBS_MAX {
                return at(format!("{} jobs; at most {JOBS_MAX}", n.jobs.len()));
            }
            if let Some(j) = n.jobs.iter().find(|j| j.start_s >= j.end_s || j.far_mib > 1 << 30) {
                return at(format!(
                    "a job from {} s to {} s of {} MiB",
                    j.start_s, j.end_s, j.far_mib
                ));
            }
        }
        Ok(())
    }
}
