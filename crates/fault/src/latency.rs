//! A latency histogram that the handler records into and anyone reads:
//! relaxed atomic buckets, log-linear (eight per power of two, so a
//! quantile is within 12.5%), from 1 ns to about 9 minutes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Values below this have a bucket each.
const LINEAR_MAX: u64 = 16;
const SUB_BITS: u32 = 3;
const SUBS: usize = 1 << SUB_BITS;
/// Powers of two from 2^4 to 2^39 ns (549 s); longer lands in the last.
const POWERS: usize = 36;
const BUCKETS: usize = LINEAR_MAX as usize + POWERS * SUBS;

pub(crate) struct Histogram {
    buckets: [AtomicU64; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { buckets: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

fn bucket(ns: u64) -> usize {
    if ns < LINEAR_MAX {
        return ns as usize;
    }
    let power = 63 - ns.leading_zeros();
    let sub = ((ns >> (power - SUB_BITS)) as usize) & (SUBS - 1);
    let index = LINEAR_MAX as usize + (power as usize - 4) * SUBS + sub;
    index.min(BUCKETS - 1)
}

/// The middle of a bucket's range.
fn bucket_mid_ns(index: usize) -> u64 {
    if index < LINEAR_MAX as usize {
        return index as u64;
    }
    let power = ((index - LINEAR_MAX as usize) / SUBS + 4) as u32;
    let sub = ((index - LINEAR_MAX as usize) % SUBS) as u64;
    let low = (1u64 << power) + (sub << (power - SUB_BITS));
    low + (1u64 << (power - SUB_BITS)) / 2
}

impl Histogram {
    pub(crate) fn record_ns(&self, ns: u64) {
        self.buckets[bucket(ns)].fetch_add(1, Relaxed);
    }

    /// The value below which `q` of the recorded values lie; 0 if none.
    pub(crate) fn quantile_ns(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (index, &count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_mid_ns(index);
            }
        }
        unreachable!("the ranks add up to the total")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_an_eighth() {
        let h = Histogram::default();
        assert_eq!(h.quantile_ns(0.5), 0, "empty");
        for us in 1..=1000u64 {
            h.record_ns(us * 1000);
        }
        for (q, want) in [(0.5, 500_000.0), (0.99, 990_000.0), (0.999, 999_000.0)] {
            let got = h.quantile_ns(q) as f64;
            assert!((got - want).abs() / want < 0.125, "q{q}: {got} against {want}");
        }
    }

    #[test]
    fn every_value_has_a_bucket_that_contains_it() {
        for ns in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let index = bucket(ns);
            assert!(index < BUCKETS);
            if ns < 1 << 39 {
                let mid = bucket_mid_ns(index) as f64;
                assert!((mid - ns as f64).abs() <= ns as f64 / 16.0 + 1.0, "{ns} -> {mid}");
            }
        }
    }
}
