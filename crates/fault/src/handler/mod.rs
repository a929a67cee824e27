//! The handler thread: reads fault messages and resolves each one, evicting a
//! batch first when the resident budget is full. `Handler` joins the parts:
//! the state they share (`shared::Core`: uffd, page table, store, counters),
//! eviction, prefetch, block reads and huge pages, each owning its own. This
//! thread alone owns all of it, so the state machine needs no locks.

mod events;
mod failsafe;
mod park;
mod resolve;

use crate::kernel::uffd::{self, Fault, Msg, Ready};
use crate::shared::{Core, Step};
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;
use std::io;
use std::io::PipeReader;
use std::os::fd::AsFd;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Poll wakes at least this often even with nothing to do.
const POLL_TIMEOUT_MS: i32 = 1000;
/// While faults wait for a retry, poll this often.
const DEFERRED_POLL_MS: i32 = 1;
/// Faults put off because an event was pending (EAGAIN); each is one
/// blocked thread, so this many is plenty. Past it, a faulter is woken
/// instead and faults again.
const DEFERRED_MAX: usize = 64;

pub(crate) struct Handler {
    /// What every part reads and changes: the uffd, the page table, the
    /// store, the counters, the budget (`shared.rs`).
    pub core: Core,
    /// The eviction's staging, write-back and batch state (`evict/mod.rs`).
    pub eviction: crate::evict::Eviction,
    /// Prefetch along trends (`prefetch/mod.rs`) and block reads around a miss
    /// (`prefetch/read_block.rs`).
    pub ahead: crate::prefetch::Ahead,
    pub blocks: crate::prefetch::read_block::Blocks,
    /// Huge pages while every page fits (`huge.rs`), if on.
    pub huge: Option<crate::huge::Huge>,
    /// Faults to try again once pending events are read; at most
    /// `DEFERRED_MAX`.
    pub deferred: Vec<Fault>,
    /// How long to poll without sleeping before a sleeping wait.
    pub spin: Duration,
    /// The CPU this thread runs on follows the faulting threads.
    pub follow: crate::kernel::cpu::Follow,
    /// Running average of the idle time before a message came.
    pub recent_gap: Duration,
    /// Held still across a fork (`fork/pause.rs`).
    pub pause: std::sync::Arc<crate::fork::pause::Pause>,
    /// What the last fork left to do (`fork/`): eviction and the faults
    /// it touches ask it first.
    pub fork: crate::fork::Forks,
}

impl Handler {
    /// Serve faults until the stop pipe is written to or closed, then give
    /// the ranges up so that unmapping them waits on nobody. If serving
    /// fails (a panic, or poll/read on the uffd failing), fall back to
    /// `failed`: every page not mapped then raises SIGBUS instead of
    /// leaving its faulting threads waiting for ever.
    pub fn run(mut self, stop: PipeReader) {
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| self.serve(&stop)));
        let failure = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(reason)) => Some(reason),
            Err(panic) => Some(format!("panicked: {}", panic_text(panic.as_ref()))),
        };
        if let Some(reason) = failure {
            self.failed(&reason, &stop);
        }
        self.unregister();
    }

    fn serve(&mut self, stop: &PipeReader) -> Result<(), String> {
        let mut msgs = [Msg::default(); 16];
        loop {
            if self.core.counters.fail_requested.load(Relaxed) {
                panic!("handler failure forced through Region::fail_handler_for_tests");
            }
            if self.pause.asked() {
                self.park_for_fork();
            }
            self.eviction.settle_done(&mut self.core);
            self.ahead.poll_fetch(&mut self.core, &mut self.eviction, &mut self.fork);
            self.follow_budget();
            self.empty_pool_if_all_fits();
            if let Some(huge) = self.huge.as_mut() {
                huge.scan(&self.core.table, self.core.base, self.core.budget_pages);
            }
            let ahead = self.eviction.wants_headroom(&self.core);
            let lazy = self.fork.busy();
            // Finished fetches and write-backs ring the bell; the short
            // timeout while they are out is only a backstop.
            let waiting = !self.deferred.is_empty()
                || self.eviction.writer.any_busy()
                || self.ahead.fetcher.busy();
            let timeout = match (ahead || lazy, waiting) {
                (true, _) => 0,
                (false, true) => DEFERRED_POLL_MS,
                (false, false) => POLL_TIMEOUT_MS,
            };
            match self.wait(stop, timeout) {
                Ok(Ready::Stop) => return Ok(()),
                // A fetch or write-back finished: the loop's top takes it.
                Ok(Ready::Bell) => self.core.bell.clear(),
                Ok(Ready::Nothing) if ahead => {
                    self.eviction.evict_ahead(&mut self.core, &mut self.fork)
                }
                Ok(Ready::Nothing) if lazy => self.fork.write_some(&mut self.core),
                Ok(Ready::Nothing) => {}
                Ok(Ready::Faults) => {
                    let n =
                        self.core.uffd.read_msgs(&mut msgs).map_err(|e| format!("read: {e}"))?;
                    self.eviction.headroom_stalled = false;
                    self.ahead.finish_fetch_before_events(
                        &mut self.core,
                        &mut self.eviction,
                        &mut self.fork,
                        &msgs[..n],
                    );
                    // Events first. Reading a REMOVE lets the madvising thread
                    // go on and zap the range at once; a fault read with it,
                    // answered first, could prefetch that range and map its
                    // old bytes after the zap, resurrecting discarded data.
                    // Every thread waiting in the batch is still waiting, so
                    // either order is one the program could have seen.
                    let is_fault = |msg: &&Msg| matches!(msg, Msg::Fault(_));
                    let events = msgs[..n].iter().filter(|msg| !is_fault(msg));
                    let faults = msgs[..n].iter().filter(is_fault);
                    self.note_companions(&msgs[..n]);
                    events.chain(faults).for_each(|&msg| self.message(msg));
                    self.blocks.companions.clear();
                }
                Err(e) => return Err(format!("poll: {e}")),
            }
            self.retry_deferred();
        }
    }

    /// `uffd::wait`, but first, if spinning is on, the wait would sleep,
    /// and messages have lately come sooner than `spin` after the handler
    /// went idle, poll without sleeping for up to `spin`: a fault that
    /// comes meanwhile is seen without waking a sleeping thread. When
    /// faults come further apart, spinning would only burn the core (and,
    /// where the faulting thread shares it, delay that thread), so the
    /// handler sleeps at once.
    fn wait(&mut self, stop: &PipeReader, timeout_ms: i32) -> io::Result<Ready> {
        let idle_since = Instant::now();
        let spin = timeout_ms > 0 && !self.spin.is_zero() && self.recent_gap < self.spin;
        if spin {
            let deadline = idle_since + self.spin;
            // Bounded by the deadline; each turn is one poll syscall.
            while Instant::now() < deadline {
                match uffd::wait(&self.core.uffd, stop, Some(self.core.bell.as_fd()), 0)? {
                    Ready::Nothing => std::hint::spin_loop(),
                    ready => return Ok(self.note_gap(idle_since, ready)),
                }
            }
        }
        let ready = uffd::wait(&self.core.uffd, stop, Some(self.core.bell.as_fd()), timeout_ms)?;
        Ok(self.note_gap(idle_since, ready))
    }

    /// Keep a running average (weight 1/4) of the idle gap before messages.
    fn note_gap(&mut self, idle_since: Instant, ready: Ready) -> Ready {
        if ready == Ready::Faults {
            let gap = idle_since.elapsed();
            self.recent_gap = (self.recent_gap * 3 + gap) / 4;
        }
        ready
    }

    fn unregister(&mut self) {
        if let Some(trace) = self.core.trace.as_mut() {
            trace.flush();
        }
        let region = self.core.pages as usize * PAGE_SIZE;
        if let Err(e) = self.core.uffd.unregister(self.core.base, region) {
            tracing::warn!("fault handler: unregistering the region failed: {e}");
        }
        let staging = &self.eviction.staging;
        if let Err(e) = self.core.staging_uffd.unregister(staging.addr(), staging.len_bytes()) {
            tracing::warn!("fault handler: unregistering staging failed: {e}");
        }
    }

    fn message(&mut self, msg: Msg) {
        match msg {
            Msg::Fault(fault) => {
                if self.follow.fault(fault.tid) {
                    Counters::add(&self.core.counters.handler_moves, 1);
                }
                if self.fault(fault) == Step::Again {
                    self.defer(fault);
                }
            }
            Msg::Remove { start, end } => self.removed(start, end, false),
            Msg::Unmap { start, end } => self.removed(start, end, true),
            Msg::Remap { from, to, len } => self.remapped(from, to, len),
            // A region's descriptor never asks for fork events (`fork/`
            // follows forks its own way); only a shared segment's does.
            Msg::Fork { .. } => {}
        }
    }

    /// The missing-page faults of one read of the uffd: each may have its
    /// page read along with another's (`handler/resolve.rs`). Only when there are
    /// two or more, and batching is on.
    fn note_companions(&mut self, msgs: &[Msg]) {
        self.blocks.companions.clear();
        if self.blocks.companion_buf.is_none() {
            return;
        }
        for msg in msgs {
            let Msg::Fault(f) = msg else { continue };
            let page = f.addr.wrapping_sub(self.core.base) / PAGE_SIZE;
            if !f.wp && page < self.core.pages as usize {
                self.blocks.companions.push((page as u32, f.write));
            }
        }
        if self.blocks.companions.len() < 2 {
            self.blocks.companions.clear();
        }
    }

    fn defer(&mut self, fault: Fault) {
        Counters::add(&self.core.counters.faults_deferred, 1);
        if self.deferred.len() < DEFERRED_MAX {
            self.deferred.push(fault);
        } else if let Err(e) = self.core.uffd.wake(fault.addr & !(PAGE_SIZE - 1), PAGE_SIZE) {
            tracing::error!("fault handler: waking a deferred fault failed: {e}");
        }
    }

    /// Try the deferred faults once each; those still refused stay.
    fn retry_deferred(&mut self) {
        let mut deferred = std::mem::take(&mut self.deferred);
        deferred.retain(|&fault| self.fault(fault) == Step::Again);
        self.deferred = deferred;
    }

    /// Take a budget set by `Region::set_budget_pages`. Going down, the
    /// pool's cap follows at once and eviction ahead brings the mapped
    /// pages down (`wants_headroom` sees them over).
    fn follow_budget(&mut self) {
        let target = self.core.counters.budget_target_pages.load(Relaxed) as usize;
        if target == 0 || target == self.core.budget_pages {
            return;
        }
        self.core.budget_pages = target;
        self.core.counters.budget_pages.store(target as u64, Relaxed);
        if let Some(pool) = self.core.zpool.as_mut() {
            pool.cap(crate::zpool::pool_pages_max(target - self.core.reserve.max_pages()));
        }
        self.eviction.headroom_stalled = false;
        self.core.publish_resident();
    }

    /// Once every page held fits the budget, all of them may be mapped:
    /// the pool's copies only take room from them.
    fn empty_pool_if_all_fits(&mut self) {
        let fits = self.core.table.held() <= self.core.budget_pages;
        if let Some(pool) = self.core.zpool.as_mut().filter(|pool| fits && !pool.is_empty()) {
            pool.clear();
            self.core.publish_resident();
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text
    } else {
        "(no message)"
    }
}
