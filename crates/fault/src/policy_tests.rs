//! The replacement policies on synthetic traces, through the page table
//! alone: S3-FIFO against FIFO on a skewed (zipf 0.99) workload, and the
//! metadata bound under churn.

use crate::state::{PageState, PageTable, Policy};

/// xorshift64*: enough randomness for a trace, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over `n` items by inverse CDF; item ranks are scattered over page
/// numbers so that hot pages are not neighbours.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, theta: f64) -> Zipf {
        let mut cdf: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(theta)).collect();
        let mut sum = 0.0;
        for c in cdf.iter_mut() {
            sum += *c;
            *c = sum;
        }
        cdf.iter_mut().for_each(|c| *c /= sum);
        Zipf { cdf }
    }

    pub fn page(&self, rng: &mut Rng) -> u32 {
        let u = rng.unit();
        let rank = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
        // An odd multiplier is a bijection modulo a power of two; fold the
        // rest back in so any n works.
        let n = self.cdf.len() as u64;
        ((rank as u64 * 0x9E37_79B9) % n) as u32
    }
}

/// Hit rate of `policy` on `trace` (page, write) with `budget` pages.
/// Only the signals the handler has are used: a miss maps the page (clean
/// on a read), a write to a clean page is a WP fault; read hits are
/// invisible.
fn hit_rate(policy: Policy, pages: u32, budget: usize, trace: &[(u32, bool)]) -> f64 {
    let mut table = PageTable::new(pages, budget, policy);
    let mut victims = Vec::new();
    let mut hits = 0;
    for &(page, write) in trace {
        match table.get(page) {
            PageState::Clean if write => {
                table.written(page);
                hits += 1;
            }
            PageState::Clean | PageState::Dirty => hits += 1,
            _ => {
                if table.resident() >= budget {
                    table.take_victims(8, &mut victims);
                    victims.iter().for_each(|&v| table.evicted(v));
                }
                table.map(page, if write { PageState::Dirty } else { PageState::Clean });
            }
        }
    }
    hits as f64 / trace.len() as f64
}

fn zipf_trace(pages: u32, len: usize, write_share: f64) -> Vec<(u32, bool)> {
    let zipf = Zipf::new(pages as usize, 0.99);
    let mut rng = Rng::new(7);
    (0..len).map(|_| (zipf.page(&mut rng), rng.unit() < write_share)).collect()
}

#[test]
fn s3fifo_beats_fifo_on_zipf_at_a_quarter_budget() {
    const PAGES: u32 = 16_384;
    for write_share in [0.0, 0.3] {
        let trace = zipf_trace(PAGES, 400_000, write_share);
        let fifo = hit_rate(Policy::Fifo, PAGES, PAGES as usize / 4, &trace);
        let s3 = hit_rate(Policy::S3Fifo, PAGES, PAGES as usize / 4, &trace);
        eprintln!("zipf 0.99, 25% budget, {write_share} writes: FIFO {fifo:.3}, S3-FIFO {s3:.3}");
        assert!(s3 > fifo + 0.02, "S3-FIFO {s3:.3} vs FIFO {fifo:.3}");
    }
}

#[test]
fn metadata_stays_within_16_bytes_per_page_under_churn() {
    const PAGES: u32 = 8192;
    for budget in [PAGES as usize, PAGES as usize / 4] {
        let trace = zipf_trace(PAGES, 100_000, 0.3);
        let mut table = PageTable::new(PAGES, budget, Policy::S3Fifo);
        let mut victims = Vec::new();
        for (i, &(page, write)) in trace.iter().enumerate() {
            if !table.get(page).is_resident() {
                if table.resident() >= budget {
                    table.take_victims(8, &mut victims);
                    victims.iter().for_each(|&v| table.evicted(v));
                }
                table.map(page, if write { PageState::Dirty } else { PageState::Clean });
            }
            if i % 5000 == 0 {
                (0..64).for_each(|p| table.forget(page.saturating_sub(p)));
                table.compact_if_stale();
            }
        }
        let per_page = table.metadata_bytes() as f64 / PAGES as f64;
        eprintln!("budget {budget}: {per_page:.2} metadata bytes per page");
        assert!(per_page <= 16.0, "{per_page} bytes per page");
    }
}

/// The compressed pool admits victims from main only (`ZPool::admits`):
/// a page evicted once and faulted back is from main when it goes again;
/// a page seen once is not.
#[test]
fn a_victim_is_from_main_only_after_it_came_back() {
    let mut table = PageTable::new(64, 4, Policy::S3Fifo);
    let mut victims = Vec::new();
    let evict_all = |table: &mut PageTable, victims: &mut Vec<u32>| {
        table.take_victims(64, victims);
        let from_main: Vec<bool> = victims.iter().map(|&p| table.victim_from_main(p)).collect();
        victims.iter().for_each(|&p| table.evicted(p));
        from_main
    };
    table.map(7, PageState::Clean);
    assert_eq!(evict_all(&mut table, &mut victims), [false], "seen once: probation");
    assert!(table.map(7, PageState::Clean), "it came back while a ghost");
    assert_eq!(evict_all(&mut table, &mut victims), [true], "came back: main");
}
