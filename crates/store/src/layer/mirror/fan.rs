//! Run one operation on every leg at once.

use super::Leg;
use std::sync::Arc;

/// Below this many pages an operation visits the legs one after the other:
/// starting a thread costs ~35 µs here, about one network round trip, so
/// only a batch that takes longer to send than that gains from overlap.
pub(super) const PARALLEL_MIN_PAGES: u64 = 16;

/// `f(leg)` for every leg, in order of `legs`. With `parallel`, on scoped
/// threads (the last leg on the caller's), so the operation costs the
/// slowest leg's time rather than the sum.
pub(super) fn each<T: Send>(
    legs: &[Arc<Leg>],
    parallel: bool,
    f: impl Fn(&Leg) -> T + Sync,
) -> Vec<T> {
    let Some((last, rest)) = legs.split_last() else { return Vec::new() };
    if rest.is_empty() || !parallel {
        return legs.iter().map(|l| f(l)).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = rest.iter().map(|leg| s.spawn(move || f(leg))).collect();
        let mine = f(last);
        let mut all: Vec<T> =
            handles.into_iter().map(|h| h.join().expect("mirror leg worker panicked")).collect();
        all.push(mine);
        all
    })
}
