//! Replay protection: per sender, the highest incarnation heard and a
//! 64-datagram sliding window of counters in it. A datagram is accepted once:
//! duplicates, datagrams older than the window and datagrams from an older
//! incarnation are refused. Reordering within the window is fine.
//!
//! Record only datagrams whose MAC verified: otherwise a forger could push a
//! sender's window forward and make its real datagrams look old.

use super::msg::NodeId;
use std::collections::HashMap;
use thiserror::Error;

/// Counters remembered behind the highest one.
pub const REPLAY_WINDOW: u64 = 64;
/// Senders tracked. A new sender beyond this evicts the one heard from
/// longest ago: with a MAC on every datagram only cluster members can add
/// senders, so this bounds memory without refusing a real new node.
pub const SENDERS_MAX: usize = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReplayError {
    #[error("counter 0 is never sent")]
    ZeroCounter,
    #[error("incarnation {got} is older than {known}: a restarted node's old datagram")]
    OldIncarnation { got: u64, known: u64 },
    #[error("counter {0} seen already (a duplicate or a replay)")]
    Duplicate(u64),
    #[error("counter {got} is more than {REPLAY_WINDOW} behind {highest}")]
    TooOld { got: u64, highest: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Window {
    incarnation: u64,
    highest: u64,
    /// Bit i set: counter `highest - i` was seen.
    seen: u64,
    last_use: u64,
}

#[derive(Debug, Default)]
pub struct ReplayGuard {
    senders: HashMap<NodeId, Window>,
    clock: u64,
}

impl ReplayGuard {
    pub fn new() -> ReplayGuard {
        ReplayGuard::default()
    }

    pub fn check_and_record(
        &mut self,
        sender: NodeId,
        incarnation: u64,
        counter: u64,
    ) -> Result<(), ReplayError> {
        if counter == 0 {
            return Err(ReplayError::ZeroCounter);
        }
        self.clock += 1;
        let clock = self.clock;
        let fresh = Window { incarnation, highest: counter, seen: 1, last_use: clock };
        let Some(w) = self.senders.get_mut(&sender) else {
            self.make_room();
            self.senders.insert(sender, fresh);
            return Ok(());
        };
        if incarnation < w.incarnation {
            return Err(ReplayError::OldIncarnation { got: incarnation, known: w.incarnation });
        }
        if incarnation > w.incarnation {
            *w = fresh;
            return Ok(());
        }
        w.last_use = clock;
        if counter > w.highest {
            let shift = counter - w.highest;
            w.seen = if shift >= 64 { 0 } else { w.seen << shift };
            w.seen |= 1;
            w.highest = counter;
            return Ok(());
        }
        let behind = w.highest - counter;
        if behind >= REPLAY_WINDOW {
            return Err(ReplayError::TooOld { got: counter, highest: w.highest });
        }
        if w.seen & (1 << behind) != 0 {
            return Err(ReplayError::Duplicate(counter));
        }
        w.seen |= 1 << behind;
        Ok(())
    }

    fn make_room(&mut self) {
        if self.senders.len() < SENDERS_MAX {
            return;
        }
        if let Some((&oldest, _)) = self.senders.iter().min_by_key(|(_, w)| w.last_use) {
            self.senders.remove(&oldest);
        }
    }

    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}
