//! Holding the handler still while the process forks (`Region::pause`).
//!
//! A forked child sees the region as it was at the fork: the pages then
//! mapped are shared with it, and the others it reads through its parent
//! from the store. For that to be one moment, nothing may move in or out of
//! the region across the fork, and every page not mapped must be wholly in
//! the store. So the handler, asked to pause, first lets every write-back
//! and fetch in flight finish (their pages then are in the store, or mapped),
//! then lists the pages the store holds (`InStore`), and parks until the
//! pause ends. Faults that come meanwhile wait, as they would for any slow
//! store read.

use crate::fork::lazy::ForkWritten;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long `Region::pause` waits for the handler to park before it looks
/// whether the handler thread is still there.
const PARK_LOOK_MS: u64 = 10;
/// A pause that takes longer than this is logged, with the step the handler
/// is at, and again at each multiple: one benchmark run stalled at a fork
/// with nothing to say where ("Forked children" in DESIGN.md).
const SLOW_PAUSE: Duration = Duration::from_secs(5);

/// What the handler is doing on its way to park, for the slow-pause log.
#[derive(Clone, Copy)]
#[repr(u8)]
pub(crate) enum PauseStep {
    Asked = 0,
    Fetches = 1,
    WriteBacks = 2,
    Cleaning = 3,
    Evicting = 4,
    Listing = 5,
}

const STEP_NAMES: [&str; 6] = [
    "has not seen the request",
    "finishing reads in flight",
    "finishing write-backs in flight",
    "writing dirty pages out",
    "evicting down to the lowered budget",
    "listing the pages in the store",
];

#[derive(Default)]
enum Phase {
    #[default]
    Running,
    /// Asked to pause; the handler has not parked yet.
    Asked,
    /// Parked with its lists.
    Parked(Parked),
    /// The owner took the list; the handler stays parked.
    Held,
}

/// What the parked handler lists, one bit a page each.
pub(crate) struct Parked {
    /// The pages whose bytes the store holds (`InStore`, `Clean`).
    pub in_store: Vec<u64>,
    /// Dirty pages write-protected for a lazy clean (`fork/lazy.rs`): the
    /// child shares them until told they are written.
    pub pending: Vec<u64>,
}

#[derive(Default)]
pub(crate) struct Pause {
    phase: Mutex<Phase>,
    changed: Condvar,
    step: AtomicU8,
    /// This pause cleans lazily (`Region::pause_lazy`).
    lazy: AtomicBool,
    /// Told which pending pages are written, from the end of the pause.
    sink: Mutex<Option<Box<dyn ForkWritten>>>,
    /// Pauses asked for so far, counted before the handler is told, so
    /// before any page is protected for that pause (`fork/copy.rs`).
    asked: AtomicU64,
}

impl Pause {
    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner: ask the handler to park. The bell must be rung after.
    pub(crate) fn ask(&self, lazy: bool) -> u64 {
        let number = self.asked.fetch_add(1, SeqCst) + 1;
        self.step.store(PauseStep::Asked as u8, Relaxed);
        self.lazy.store(lazy, Relaxed);
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.lock() = Phase::Asked;
        number
    }

    /// Pauses asked for so far.
    pub(crate) fn asked_count(&self) -> u64 {
        self.asked.load(SeqCst)
    }

    /// The handler: whether the pause asked for is lazy.
    pub(crate) fn is_lazy(&self) -> bool {
        self.lazy.load(Relaxed)
    }

    /// The owner, while the handler is parked: who to tell.
    pub(crate) fn set_sink(&self, sink: Box<dyn ForkWritten>) {
        *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// The handler, once the pause has ended.
    pub(crate) fn take_sink(&self) -> Option<Box<dyn ForkWritten>> {
        self.sink.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The handler: where it is on its way to park.
    pub(crate) fn at(&self, step: PauseStep) {
        self.step.store(step as u8, Relaxed);
    }

    /// The handler: is a pause asked for?
    pub(crate) fn asked(&self) -> bool {
        matches!(*self.lock(), Phase::Asked)
    }

    /// The handler: park with its lists until the owner ends the pause.
    /// A pause that ends and a next one asked before this thread wakes
    /// leave `Asked`, not `Running`: that ends this park too (the handler
    /// then parks again for the new one). Waiting for `Running` alone hung
    /// a Python program forking three children in a row.
    pub(crate) fn park(&self, lists: Parked) {
        let mut phase = self.lock();
        *phase = Phase::Parked(lists);
        self.changed.notify_all();
        while matches!(*phase, Phase::Parked(_) | Phase::Held) {
            phase = self.changed.wait(phase).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The owner: wait until the handler parks, and take its list. None if
    /// `alive` says the handler thread is gone (it would never park).
    pub(crate) fn wait_parked(&self, alive: impl Fn() -> bool) -> Option<Parked> {
        let started = Instant::now();
        let mut next_log = SLOW_PAUSE;
        let mut phase = self.lock();
        // Bounded by the handler's turn: it parks, or its thread ends.
        loop {
            if started.elapsed() >= next_log {
                let step = STEP_NAMES.get(self.step.load(Relaxed) as usize).unwrap_or(&"?");
                tracing::error!(
                    "fork: the fault handler is not ready after {} s; it is {step}",
                    next_log.as_secs()
                );
                next_log += SLOW_PAUSE;
            }
            if let Phase::Parked(_) = *phase {
                let Phase::Parked(lists) = std::mem::replace(&mut *phase, Phase::Held) else {
                    unreachable!("matched just above")
                };
                return Some(lists);
            }
            if !alive() {
                *phase = Phase::Running;
                return None;
            }
            let look = Duration::from_millis(PARK_LOOK_MS);
            phase = self.changed.wait_timeout(phase, look).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// The owner: let the handler go on.
    pub(crate) fn end(&self) {
        *self.lock() = Phase::Running;
        self.changed.notify_all();
    }
}
