use super::*;

/// A zipf-like trace over `pages` with a fixed LCG, so runs repeat.
fn skewed(pages: u32, len: usize) -> Vec<(u32, bool)> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let weights: Vec<f64> = (1..=pages).map(|r| 1.0 / f64::from(r)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(weights.len());
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let rank = cdf.partition_point(|&c| c < u).min(pages as usize - 1) as u32;
            // Scatter ranks over pages, as a hashed key space does.
            (rank.wrapping_mul(2_654_435_761) % pages, x & 7 == 0)
        })
        .collect()
}

#[test]
fn opt_is_a_lower_bound_and_every_policy_counts_the_same_accesses() {
    let trace = densify(&skewed(4096, 200_000));
    let outcomes: Vec<Outcome> = POLICIES.iter().map(|p| replay(p, &trace, 512, 50_000)).collect();
    let opt = outcomes.iter().find(|o| o.policy == "opt").unwrap();
    for o in &outcomes {
        assert_eq!(o.accesses, 150_000, "{}", o.policy);
        assert!(o.misses >= opt.misses, "{} beat the optimum: {o:?} vs {opt:?}", o.policy);
    }
    let ratio = |name: &str| outcomes.iter().find(|o| o.policy == name).unwrap().miss_ratio();
    // Frequency-aware policies that see hits beat plain FIFO on a skewed
    // trace, and seeing reads helps S3-FIFO.
    assert!(ratio("lru") < ratio("fifo"), "{outcomes:?}");
    assert!(ratio("arc") < ratio("fifo"), "{outcomes:?}");
    assert!(ratio("s3fifo") < ratio("s3fifo-blind"), "{outcomes:?}");
}

#[test]
fn a_cache_that_holds_every_page_misses_only_cold() {
    let raw = skewed(300, 20_000);
    let trace = densify(&raw);
    for p in POLICIES {
        let o = replay(p, &trace, trace.distinct, 0);
        assert_eq!(o.misses, trace.distinct as u64, "{p}");
    }
}

#[test]
fn a_loop_one_page_larger_than_the_cache_defeats_lru_but_not_opt() {
    let raw: Vec<(u32, bool)> = (0..100).flat_map(|_| (0..11).map(|p| (p, false))).collect();
    let trace = densify(&raw);
    let lru = replay("lru", &trace, 10, 0);
    let opt = replay("opt", &trace, 10, 0);
    assert_eq!(lru.misses, 1100, "LRU misses every access of a cyclic scan");
    assert!(opt.misses < 200, "{opt:?}");
}
