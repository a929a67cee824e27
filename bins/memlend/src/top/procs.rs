//! `memlend top`'s processes: the live files (`memlend_node::live`) and
//! their fault rates between two looks.

use memlend_node::live::{self, Proc};
use std::collections::HashMap;

/// Per process: the last sample that differed from the one before (when
/// it was written, store and pool faults) and the rates it gave.
#[derive(Default)]
pub struct Procs {
    last: HashMap<u32, Last>,
}

#[derive(Clone, Copy)]
struct Last {
    written_ms: u64,
    store: u64,
    pool: u64,
    rates: Option<(f64, f64)>,
}

impl Procs {
    /// Shims write once a second: a look that finds the same file as the
    /// last shows the same rates.
    pub fn look(&mut self) -> Vec<Proc> {
        let mut seen = HashMap::new();
        let mut procs = live::read_all(true);
        for p in &mut procs {
            let mut now = Last {
                written_ms: p.written_unix_ms,
                store: p.faults_from_store,
                pool: p.faults_from_pool,
                rates: None,
            };
            if let Some(last) = self.last.get(&p.pid) {
                let secs = now.written_ms.saturating_sub(last.written_ms) as f64 / 1000.0;
                now = match secs > 0.0 {
                    true => Last {
                        rates: Some((
                            now.store.saturating_sub(last.store) as f64 / secs,
                            now.pool.saturating_sub(last.pool) as f64 / secs,
                        )),
                        ..now
                    },
                    false => *last,
                };
            }
            p.store_faults_per_s = now.rates.map(|r| r.0);
            p.pool_faults_per_s = now.rates.map(|r| r.1);
            seen.insert(p.pid, now);
        }
        self.last = seen;
        procs
    }
}
