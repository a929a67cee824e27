//! Replays a page-access trace (`memlend run --trace`, read with
//! [`memlend_fault::trace::read`]) through eviction policies at a given
//! cache size, and counts their misses against Belady's offline optimum.
//!
//! The fault handler sees a page only when it faults: a miss, or the first
//! write to a page mapped write-protected. So its S3-FIFO is replayed twice:
//! `s3fifo-blind` with only those signals, as it runs today, and
//! `s3fifo` with every access, as it would run if reads of mapped pages
//! were visible. The gap between the two is what seeing reads is worth;
//! the gap to `opt` is what no online policy can win back. Both S3-FIFOs
//! and FIFO are the handler's own `PageTable`, not copies of it.

mod arc;
mod clock;
mod lists;
mod lru;
mod opt;
mod table;

/// A cache of pages under one policy.
pub trait Cache {
    /// One access to `id` (dense, below the id count given at creation);
    /// returns whether it was a hit.
    fn access(&mut self, id: u32, write: bool) -> bool;
}

/// The policies replayed, by name.
pub const POLICIES: [&str; 7] = ["fifo", "s3fifo-blind", "s3fifo", "clock", "lru", "arc", "opt"];

/// Misses of one policy over the measured part of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub policy: &'static str,
    pub cache_pages: usize,
    pub accesses: u64,
    pub misses: u64,
}

impl Outcome {
    pub fn miss_ratio(&self) -> f64 {
        self.misses as f64 / self.accesses.max(1) as f64
    }
}

/// A trace with its pages renumbered densely, in order of first use.
pub struct Dense {
    pub ids: Vec<(u32, bool)>,
    pub distinct: usize,
}

pub fn densify(trace: &[(u32, bool)]) -> Dense {
    let mut map = std::collections::HashMap::with_capacity(1 << 16);
    let ids = trace
        .iter()
        .map(|&(page, write)| {
            let next = map.len() as u32;
            (*map.entry(page).or_insert(next), write)
        })
        .collect();
    Dense { ids, distinct: map.len() }
}

fn make(policy: &str, ids: usize, cache_pages: usize, trace: &Dense) -> Box<dyn Cache> {
    match policy {
        "fifo" => Box::new(table::Table::new(ids, cache_pages, table::Kind::Fifo)),
        "s3fifo-blind" => Box::new(table::Table::new(ids, cache_pages, table::Kind::S3FifoBlind)),
        "s3fifo" => Box::new(table::Table::new(ids, cache_pages, table::Kind::S3FifoSighted)),
        "clock" => Box::new(clock::Clock::new(ids, cache_pages)),
        "lru" => Box::new(lru::Lru::new(ids, cache_pages)),
        "arc" => Box::new(arc::Arc::new(ids, cache_pages)),
        "opt" => Box::new(opt::Opt::new(&trace.ids, ids, cache_pages)),
        other => panic!("no policy {other}"),
    }
}

/// Replay `trace` through `policy` with room for `cache_pages`; misses are
/// counted from entry `warm_entries` on (the cache fills before).
pub fn replay(policy: &str, trace: &Dense, cache_pages: usize, warm_entries: usize) -> Outcome {
    assert!(cache_pages > 0, "a cache holds at least one page");
    let name = POLICIES.iter().find(|p| **p == policy).copied().expect("a known policy");
    let mut cache = make(policy, trace.distinct, cache_pages, trace);
    let (mut accesses, mut misses) = (0, 0);
    for (i, &(id, write)) in trace.ids.iter().enumerate() {
        let hit = cache.access(id, write);
        if i >= warm_entries {
            accesses += 1;
            misses += u64::from(!hit);
        }
    }
    Outcome { policy: name, cache_pages, accesses, misses }
}

#[cfg(test)]
mod tests;
