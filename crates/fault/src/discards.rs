//! Ranges that `Region::discard` is dropping right now, shared with the
//! handler. A REMOVE event says only "start..end was madvised", not whether
//! with MADV_DONTNEED (pages gone, read zero) or MADV_FREE (pages may stay,
//! with their data, until the kernel reclaims them). For a range listed
//! here the handler knows it is MADV_DONTNEED, so it can take the pages out
//! of the resident count at once; for any other range it must assume the
//! pages may stay mapped.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// More concurrent discards than this are not listed: they are still
/// correct, only handled as an unknown madvise.
const PENDING_MAX: usize = 64;
/// How long `Region::discard` waits for the handler to finish with its
/// range after madvise returned (the store discard may still be running).
const SETTLE_WAIT: Duration = Duration::from_secs(5);

struct Pending {
    start: usize,
    end: usize,
    /// The handler has settled an event inside this range.
    settled: bool,
}

#[derive(Default)]
pub(crate) struct Discards {
    pending: Mutex<Vec<Pending>>,
    settled: Condvar,
}

impl Discards {
    /// List `start..end` before madvising it; false if the list is full.
    pub fn begin(&self, start: usize, end: usize) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.len() >= PENDING_MAX {
            return false;
        }
        pending.push(Pending { start, end, settled: false });
        true
    }

    /// The handler's question: is `start..end` inside a listed discard?
    pub fn is_discard(&self, start: usize, end: usize) -> bool {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.iter().any(|p| p.start <= start && end <= p.end)
    }

    /// The handler finished with an event for `start..end`.
    pub fn settled(&self, start: usize, end: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for p in pending.iter_mut().filter(|p| p.start <= start && end <= p.end) {
            p.settled = true;
        }
        self.settled.notify_all();
    }

    /// After madvise returned: wait (bounded) until the handler settled the
    /// range, then unlist it.
    pub fn finish(&self, start: usize, end: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = std::time::Instant::now() + SETTLE_WAIT;
        loop {
            let Some(i) = pending.iter().position(|p| p.start == start && p.end == end) else {
                return;
            };
            let now = std::time::Instant::now();
            if pending[i].settled || now >= deadline {
                pending.swap_remove(i);
                return;
            }
            pending = match self.settled.wait_timeout(pending, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}
