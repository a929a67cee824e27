//! The copies of a mirror ("legs") and their states.

use crate::{PageStore, StoreError};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// A leg holds every page and may be read.
const HEALTHY: u8 = 0;
/// A leg being filled by the rebuilder: written, never read.
const REBUILDING: u8 = 1;
/// A leg that failed: neither read nor written again.
const FAILED: u8 = 2;

pub(crate) struct Leg {
    pub(crate) store: Arc<dyn PageStore>,
    /// Where the leg lives, for logs and for choosing a spare elsewhere
    /// ("10.0.0.2:7070", "ssd").
    pub(crate) label: String,
    /// `caps.fast` of the store, kept: `info()` may allocate.
    pub(crate) fast: bool,
    state: AtomicU8,
}

impl Leg {
    pub(crate) fn healthy(store: Arc<dyn PageStore>, label: String) -> Arc<Leg> {
        Leg::new(store, label, HEALTHY)
    }

    pub(crate) fn rebuilding(store: Arc<dyn PageStore>, label: String) -> Arc<Leg> {
        Leg::new(store, label, REBUILDING)
    }

    fn new(store: Arc<dyn PageStore>, label: String, state: u8) -> Arc<Leg> {
        let fast = store.info().caps.fast;
        Arc::new(Leg { store, label, fast, state: AtomicU8::new(state) })
    }

    pub(crate) fn is_healthy(&self) -> bool {
        self.state.load(Ordering::Acquire) == HEALTHY
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.state.load(Ordering::Acquire) == FAILED
    }

    /// Mark the leg failed; true for the caller that did it (it logs and
    /// counts, once per leg).
    pub(crate) fn fail(&self) -> bool {
        self.state.swap(FAILED, Ordering::AcqRel) != FAILED
    }

    /// A rebuilt leg joins the readable ones. False if it failed meanwhile.
    pub(crate) fn promote(&self) -> bool {
        let swap =
            self.state.compare_exchange(REBUILDING, HEALTHY, Ordering::AcqRel, Ordering::Acquire);
        swap.is_ok()
    }
}

/// Errors that say the caller asked for something wrong, not that the leg
/// is broken: every leg would answer the same, so no failover.
pub(crate) fn is_caller_error(e: &StoreError) -> bool {
    matches!(e, StoreError::OutOfRange { .. } | StoreError::Misaligned { .. })
}

impl Leg {
    pub(crate) fn state_name(&self) -> &'static str {
        match self.state.load(Ordering::Acquire) {
            HEALTHY => "healthy",
            REBUILDING => "rebuilding",
            _ => "failed",
        }
    }
}
