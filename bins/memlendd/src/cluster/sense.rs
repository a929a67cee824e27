//! Monitor and classifier, as the control loop uses them: read memory,
//! leave out what this daemon holds for borrowers (lent pages are not the
//! node's own demand), classify, and cap the allowance at `--lend`.

use memlend_pool::classify::Classifier;
use memlend_pool::engine::Status;
use memlend_pool::monitor::{MemorySource, Sample};

pub struct Sense {
    pub source: MemorySource,
    pub classifier: Classifier,
    /// `--lend`: never lend more than this, whatever the classifier allows.
    pub cap_bytes: Option<u64>,
}

impl Sense {
    pub fn sample(
        &mut self,
        now_ms: u64,
        lent_bytes: u64,
        far_demand_bytes: u64,
    ) -> anyhow::Result<Status> {
        let raw = self.source.read()?;
        let own = Sample { used_bytes: raw.used_bytes.saturating_sub(self_rss_bytes()), ..raw };
        let v = self.classifier.update(now_ms, &own, lent_bytes, far_demand_bytes);
        let lendable = self.cap_bytes.map_or(v.lendable_bytes, |c| c.min(v.lendable_bytes));
        Ok(Status {
            class: v.class,
            total_bytes: own.total_bytes,
            used_bytes: own.used_bytes,
            lendable_bytes: lendable,
        })
    }
}

/// This process's resident memory: the lent pages borrowers have written.
fn self_rss_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = text.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * memlend_store::PAGE_SIZE as u64
}
