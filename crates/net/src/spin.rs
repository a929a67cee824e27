//! How long a server thread polls for the next request before sleeping.
//!
//! A thread asleep on an idle vCPU takes tens of µs to run again here (the
//! host must wake the vCPU): a loopback donor that did not spin served
//! uniform faults at 16-19 K/s against 59-61 K/s with a 50 µs spin. The
//! spin must outlast the gap between a borrower's requests: over two or
//! three donors each sees half or a third of them, and 50 µs was too short
//! (43 K and 35 K/s; with 200 µs, 53 K and 46 K). But a long spin after
//! every request of a borrower that faults only now and then is CPU taken
//! from the donor's own work for nothing. So spin the whole budget while
//! recent requests came within it, and not at all once they stop doing so.
//!
//! A wait that slept is longer by the wakeup, which slows the borrower too,
//! so gaps just under the budget could stop the spinning for good (a 50 µs
//! budget with two donors fell to 16 K faults/s). So one wait in
//! `PROBE_EVERY` spins anyway, and a probe that catches the request within
//! the budget turns spinning back on.
//!
//! Each connection spins alone, with no cap on how many spin at once. A
//! donor-wide cap (past it a connection sleeps in `read`) was measured and
//! not kept: one borrower striped over three slabs of one loopback donor
//! (1 GiB, 257 MiB local, random touches) ran 46.2-46.8 K/s with one
//! spinner allowed and 48.3-49.5 K with two, against 50.8-54.9 K uncapped;
//! the donor's CPU time did not fall. The yield between polls already lets
//! other threads run.

use std::time::Duration;

/// Weight of a new wait in the running average: 1/8.
const AVERAGE_SHIFT: u32 = 3;
/// A wait counts at most this many budgets, so that one long idle spell
/// is forgotten after a few quick requests.
const WAIT_CAP_BUDGETS: u64 = 4;
/// While not spinning, spin anyway once in this many waits.
const PROBE_EVERY: u32 = 8;

/// The spin budget for the next wait, from the waits before it.
#[derive(Clone, Debug)]
pub struct AdaptiveSpin {
    budget_ns: u64,
    wait_avg_ns: u64,
    waits: u32,
    /// The current wait spins as a probe.
    probing: bool,
}

impl AdaptiveSpin {
    /// Spin at most `budget` (zero: never).
    pub fn new(budget: Duration) -> AdaptiveSpin {
        let budget_ns = budget.as_nanos().min(u128::from(u64::MAX)) as u64;
        AdaptiveSpin { budget_ns, wait_avg_ns: 0, waits: 0, probing: false }
    }

    /// How long to poll before sleeping this time.
    pub fn budget(&mut self) -> Duration {
        let spinning = self.wait_avg_ns <= self.budget_ns;
        self.probing = !spinning && self.waits.is_multiple_of(PROBE_EVERY);
        if spinning || self.probing {
            Duration::from_nanos(self.budget_ns)
        } else {
            Duration::ZERO
        }
    }

    /// The input came `waited` after the wait began (spinning or asleep).
    pub fn waited(&mut self, waited: Duration) {
        let cap = self.budget_ns.saturating_mul(WAIT_CAP_BUDGETS);
        let wait = (waited.as_nanos().min(u128::from(cap))) as u64;
        self.waits = self.waits.wrapping_add(1);
        if std::mem::take(&mut self.probing) && wait <= self.budget_ns {
            // Caught by the probe: requests come within the budget again.
            self.wait_avg_ns = wait;
            return;
        }
        self.wait_avg_ns =
            self.wait_avg_ns - (self.wait_avg_ns >> AVERAGE_SHIFT) + (wait >> AVERAGE_SHIFT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(200);

    #[test]
    fn spins_while_requests_come_within_the_budget() {
        let mut s = AdaptiveSpin::new(BUDGET);
        for _ in 0..100 {
            assert_eq!(s.budget(), BUDGET);
            s.waited(Duration::from_micros(60));
        }
        assert_eq!(s.budget(), BUDGET);
    }

    #[test]
    fn stops_for_a_sparse_client_but_for_a_probe_in_eight() {
        let mut s = AdaptiveSpin::new(BUDGET);
        (0..20).for_each(|_| s.waited(Duration::from_millis(5)));
        let spins = (0..80)
            .filter(|_| {
                let spun = !s.budget().is_zero();
                s.waited(Duration::from_millis(5));
                spun
            })
            .count();
        assert_eq!(spins, 10, "one probe in eight");
    }

    #[test]
    fn a_busy_client_is_spun_for_again_within_a_few_dozen_requests() {
        let mut s = AdaptiveSpin::new(BUDGET);
        // A long idle spell counts as four budgets at most.
        s.waited(Duration::from_secs(60));
        (0..20).for_each(|_| s.waited(Duration::from_millis(5)));
        let mut quick = 0;
        while s.budget().is_zero() || s.waits.is_multiple_of(PROBE_EVERY) {
            s.waited(Duration::from_micros(20));
            quick += 1;
            assert!(quick < 30, "not spinning after {quick} quick requests");
        }
    }

    #[test]
    fn spinning_stopped_by_slept_waits_comes_back_through_a_probe() {
        // Requests 45 µs apart against a 50 µs budget, but asleep each wait
        // looks 60 µs longer (the wakeup): the average alone would never
        // come back under the budget.
        let budget = Duration::from_micros(50);
        let mut s = AdaptiveSpin::new(budget);
        (0..20).for_each(|_| s.waited(Duration::from_millis(1)));
        assert!(s.budget().is_zero() || s.probing);
        let mut spun = 0;
        for _ in 0..800 {
            let spinning = !s.budget().is_zero();
            spun += usize::from(spinning);
            s.waited(Duration::from_micros(if spinning { 45 } else { 105 }));
        }
        assert!(spun > 780, "spun {spun} of 800 waits");
    }

    #[test]
    fn a_zero_budget_never_spins() {
        let mut s = AdaptiveSpin::new(Duration::ZERO);
        s.waited(Duration::ZERO);
        assert!(s.budget().is_zero());
    }
}
