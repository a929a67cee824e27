//! The lease agent's line to the local `memlendd`: asks go out on the
//! client; the daemon's tells and the region's own asks come in as
//! events. While the agent waits for grants, other events are set aside,
//! in order, and handed out first afterwards.

use super::{Event, PENDING_MAX};
use memlend_pool::api::{Ask, Client, LeaseGrant, Tell};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The first pause before asking again for what the cluster could not lend.
const RETRY_FIRST: Duration = Duration::from_millis(100);

pub(crate) struct Daemon {
    client: Client,
    events: Receiver<Event>,
    /// Events that came while grants were awaited, at most `PENDING_MAX`.
    pending: VecDeque<Event>,
}

impl Daemon {
    pub(crate) fn new(client: Client, events: Receiver<Event>) -> Daemon {
        Daemon { client, events, pending: VecDeque::new() }
    }

    /// The next event, set-aside ones first, waiting at most `wait`;
    /// `Err` once every sender is gone.
    pub(crate) fn next(&mut self, wait: Duration) -> Result<Option<Event>, ()> {
        if let Some(e) = self.pending.pop_front() {
            return Ok(Some(e));
        }
        match self.events.recv_timeout(wait) {
            Ok(e) => Ok(Some(e)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(()),
        }
    }

    /// Send `ask`; a lost daemon is heard of as `Event::Gone`, so the
    /// error is not the caller's to handle.
    pub(crate) fn ask(&mut self, ask: &Ask) -> bool {
        self.client.ask(ask).is_ok()
    }

    pub(crate) fn release(&mut self, donor: u64, lease: u64) {
        self.ask(&Ask::Release { donor, lease });
    }

    pub(crate) fn release_grants(&mut self, grants: &[LeaseGrant]) {
        for g in grants {
            self.release(g.donor, g.lease);
        }
    }

    /// Leases toward `bytes` that come within `wait`, from donors other
    /// than `avoid`. On an `Unmet`, ask again for what is missing after a
    /// pause (doubling) when `again`, else stop. Other events are set aside
    /// for later.
    pub(crate) fn await_grants(
        &mut self,
        bytes: u64,
        wait: Duration,
        again: bool,
        avoid: &[u64],
    ) -> Vec<LeaseGrant> {
        let mut got = Vec::new();
        let want = |bytes| Ask::Want { bytes, avoid: avoid.to_vec() };
        if !self.ask(&want(bytes)) {
            return got;
        }
        let until = Instant::now() + wait;
        let (mut sum, mut pause) = (0, RETRY_FIRST);
        while sum < bytes {
            let Some(left) = until.checked_duration_since(Instant::now()) else { break };
            match self.events.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(Event::Tell(Tell::Lease(g))) => {
                    sum += g.bytes;
                    got.push(g);
                }
                Ok(Event::Tell(Tell::Unmet { bytes: unmet })) => {
                    if !again || Instant::now() + pause >= until {
                        break;
                    }
                    std::thread::sleep(pause);
                    pause *= 2;
                    if !self.ask(&want(unmet)) {
                        break;
                    }
                }
                Ok(Event::Tell(Tell::Error { message })) => {
                    tracing::warn!(%message, "memlendd refused an ask for leases");
                    break;
                }
                Ok(other) if self.pending.len() < PENDING_MAX => self.pending.push_back(other),
                Ok(_) => tracing::error!("too many events set aside; one dropped"),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        got
    }
}
