use super::*;
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

fn sample(used: f64) -> Sample {
    Sample {
        total_bytes: 10 * GIB,
        used_bytes: (used * 10.0 * GIB as f64) as u64,
        psi_some_avg10: None,
        psi_full_avg10: None,
    }
}

fn instant() -> Classifier {
    // alpha 1: no smoothing, so each sample is the level under test.
    Classifier::new(
        Thresholds::default(),
        Timing { hold_ms_min: 5_000, confirm_samples: 2, quiet_samples: 3, alpha: 1.0 },
    )
    .unwrap()
}

/// Feed `used` once a second from `t_ms`; the classes seen.
fn feed(c: &mut Classifier, t_ms: &mut u64, used: &[f64], unmet: u64) -> Vec<NodeClass> {
    used.iter()
        .map(|&u| {
            *t_ms += 1_000;
            c.update(*t_ms, &sample(u), 0, unmet).class
        })
        .collect()
}

#[test]
fn each_transition_with_its_guard_band() {
    use NodeClass::*;
    let mut c = instant();
    let mut t = 10_000;
    assert_eq!(
        feed(&mut c, &mut t, &[0.2, 0.2], 0),
        vec![Neutral, Server],
        "two samples under LOW_MIN"
    );
    assert_eq!(
        feed(&mut c, &mut t, &[0.45, 0.45, 0.45], 0),
        vec![Server; 3],
        "inside the band: stays"
    );
    assert_eq!(feed(&mut c, &mut t, &[0.6, 0.6], 0), vec![Server, Neutral]);
    assert_eq!(
        feed(&mut c, &mut t, &[0.8, 0.8, 0.8], 0),
        vec![Neutral; 3],
        "under HIGH_MAX: neutral"
    );
    assert_eq!(
        feed(&mut c, &mut t, &[0.9, 0.9, 0.9], 0),
        vec![Neutral, Client, Client],
        "two samples, after 5 s held"
    );
    assert_eq!(
        feed(&mut c, &mut t, &[0.8, 0.8, 0.8], 0),
        vec![Client; 3],
        "above LOW_MAX: stays client"
    );
    let seq = feed(&mut c, &mut t, &[0.7, 0.7, 0.7, 0.7, 0.7, 0.7], 0);
    assert_eq!(seq.last(), Some(&Neutral));
}

#[test]
fn unmet_far_memory_demand_makes_a_client() {
    let mut c = instant();
    let mut t = 10_000;
    let seq = feed(&mut c, &mut t, &[0.3; 8], 1 << 20);
    assert_eq!(seq.last(), Some(&NodeClass::Client));
    let seq = feed(&mut c, &mut t, &[0.3; 8], 0);
    assert_eq!(seq.last(), Some(&NodeClass::Server), "demand met, memory free: a server again");
}

#[test]
fn a_server_leaves_at_once_in_an_emergency() {
    let mut c = instant();
    let mut t = 10_000;
    feed(&mut c, &mut t, &[0.1, 0.1], 0);
    assert_eq!(c.class(), NodeClass::Server);
    t += 100; // well inside the hold time
    let v = c.update(t, &sample(0.95), GIB, 0);
    assert!(v.changed && v.class == NodeClass::Client);
    assert_eq!(v.lendable_bytes, 0);
    assert_eq!(v.reclaim_bytes, GIB, "everything lent comes back");
}

#[test]
fn the_offer_comes_with_the_class_then_grows_only_after_quiet_samples() {
    let mut c = instant();
    let mut t = 10_000;
    let mut offer = |c: &mut Classifier, u: f64| {
        t += 1_000;
        c.update(t, &sample(u), 0, 0).lendable_bytes
    };
    assert_eq!(offer(&mut c, 0.1), 0, "one sample: not yet a server");
    assert_eq!(offer(&mut c, 0.1), 4 * GIB, "a server: HIGH_MIN 50% of 10 GiB minus 1 GiB own use");
    assert_eq!(offer(&mut c, 0.3), 2 * GIB, "shrinks at once");
    assert_eq!(offer(&mut c, 0.1), 2 * GIB, "quiet 1");
    assert_eq!(offer(&mut c, 0.1), 2 * GIB, "quiet 2");
    assert_eq!(offer(&mut c, 0.1), 4 * GIB, "grows after 3 quiet samples");
    assert_eq!(offer(&mut c, 0.3), 2 * GIB);
    let mut pressured = sample(0.1);
    pressured.psi_some_avg10 = Some(20.0);
    for _ in 0..5 {
        t += 1_000;
        assert_eq!(
            c.update(t, &pressured, 0, 0).lendable_bytes,
            2 * GIB,
            "no growth under pressure"
        );
    }
}

#[test]
fn bad_thresholds_are_refused_clearly() {
    assert!("0.4,0.5,0.75,0.85".parse::<Thresholds>().is_ok());
    assert!(matches!("0.5,0.4,0.75,0.85".parse::<Thresholds>(), Err(ConfigError::Order(_))));
    assert!(matches!("0.4,0.5".parse::<Thresholds>(), Err(ConfigError::Syntax(_))));
    assert!(matches!("a,b,c,d".parse::<Thresholds>(), Err(ConfigError::Syntax(_))));
    assert!(
        Classifier::new(Thresholds::default(), Timing { alpha: 0.0, ..Timing::default() }).is_err()
    );
}

proptest! {
    /// Noise inside a guard band never changes the class.
    #[test]
    fn noise_inside_a_band_never_flips(noise in proptest::collection::vec(0.0f64..1.0, 1..60)) {
        for (start, lo, hi) in [(0.2, 0.41, 0.49), (0.95, 0.76, 0.84)] {
            let mut c = Classifier::new(Thresholds::default(), Timing::default()).unwrap();
            let mut t = 0;
            for _ in 0..20 {
                t += 1_000;
                c.update(t, &sample(start), 0, 0);
            }
            let settled = c.class();
            for n in &noise {
                t += 1_000;
                let v = c.update(t, &sample(lo + n * (hi - lo)), 0, 0);
                prop_assert_eq!(v.class, settled);
            }
        }
    }

    /// No two changes within the hold time unless a server hits HIGH_MAX,
    /// and a server never lends beyond MEM_MIN_HIGH.
    #[test]
    fn holds_and_offers_respect_their_limits(levels in proptest::collection::vec(0.0f64..1.0, 1..80)) {
        let mut c = Classifier::new(Thresholds::default(), Timing::default()).unwrap();
        let (mut t, mut last_change) = (0u64, None::<u64>);
        for u in levels {
            t += 500;
            let was = c.class();
            let s = sample(u);
            let v = c.update(t, &s, 0, 0);
            if v.changed {
                let emergency = was == NodeClass::Server;
                if let (Some(prev), false) = (last_change, emergency) {
                    prop_assert!(t - prev >= 5_000);
                }
                last_change = Some(t);
            }
            if v.lendable_bytes > 0 {
                prop_assert!(s.used_bytes + v.lendable_bytes <= (s.total_bytes as f64 * 0.5) as u64 + 1);
            }
        }
    }
}
