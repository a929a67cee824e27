//! Server counters. Each connection counts locally and publishes once per
//! batch, so the hot path never touches a shared cache line per request.

use super::ops::Outcome;
use memlend_wire::page::Opcode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub struct ServerStats {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub pages_read: AtomicU64,
    pub pages_written: AtomicU64,
    pub connections_total: AtomicU64,
    pub handshakes_failed: AtomicU64,
    /// Requests answered from a session's window after a resume, not
    /// applied again.
    pub replays: AtomicU64,
}

#[derive(Default)]
pub struct ConnCounters {
    requests: u64,
    errors: u64,
    pages_read: u64,
    pages_written: u64,
    pub replays: u64,
}

impl ConnCounters {
    pub fn count(&mut self, outcome: &Outcome) {
        self.requests += 1;
        match outcome {
            Outcome::Done { op: Opcode::Read | Opcode::ReadV, pages } => self.pages_read += pages,
            Outcome::Done { op: Opcode::Write | Opcode::WriteV, pages } => {
                self.pages_written += pages
            }
            Outcome::Failed(_) => self.errors += 1,
            _ => {}
        }
    }
}

impl ServerStats {
    pub fn publish(&self, c: &mut ConnCounters) {
        if c.requests == 0 && c.replays == 0 {
            return;
        }
        self.replays.fetch_add(c.replays, Relaxed);
        self.requests.fetch_add(c.requests, Relaxed);
        self.errors.fetch_add(c.errors, Relaxed);
        self.pages_read.fetch_add(c.pages_read, Relaxed);
        self.pages_written.fetch_add(c.pages_written, Relaxed);
        *c = ConnCounters::default();
    }
}
