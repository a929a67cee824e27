//! Sessions that outlive a connection, so that a borrower cut off mid-way
//! can resume and have every request applied exactly once (Aprius's
//! replay window, over TCP).
//!
//! A session counts the requests it applied, in order: `applied_seq`. Every
//! request carries the next number. After a reconnect the borrower says
//! which session it resumes; WELCOME tells it `applied_seq`, and it sends
//! again every request it has no reply for. A request at or below
//! `applied_seq` is a replay: a write, discard, open or close is answered
//! from a window of recent results without being applied again; a read is
//! served again (it changes nothing). A request with seq 0 is untracked.
//!
//! Fencing. A resume bumps the session's epoch under its lock. A connection
//! applies each request holding that lock and checks its epoch first, so
//! once a resume returns, the old connection can apply nothing more: no
//! stale request sitting in a dead socket's buffer can overwrite a newer
//! write.

use super::registry::BorrowerId;
use memlend_wire::page::{Opcode, Status};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Result of an applied request, kept for replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    pub seq: u64,
    pub status: Status,
    pub value: u64,
}

pub struct Progress {
    epoch: u64,
    pub applied_seq: u64,
    /// Results of the last `window.len()` requests, at `seq % len`.
    window: Box<[Done]>,
    attached: bool,
    detached_at: Option<Instant>,
}

impl Progress {
    /// The kept result of request `seq`, if it is still in the window.
    pub fn result(&self, seq: u64) -> Option<Done> {
        let d = self.window[(seq % self.window.len() as u64) as usize];
        (d.seq == seq).then_some(d)
    }

    pub fn record(&mut self, d: Done) {
        let len = self.window.len() as u64;
        self.applied_seq = d.seq;
        self.window[(d.seq % len) as usize] = d;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

pub struct Session {
    pub id: u64,
    pub borrower: BorrowerId,
    progress: Mutex<Progress>,
}

impl Session {
    pub fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock()
    }

    /// The connection of `epoch` is gone; the session waits for a resume.
    pub fn detach(&self, epoch: u64) {
        let mut p = self.progress.lock();
        if p.epoch == epoch {
            p.attached = false;
            p.detached_at = Some(Instant::now());
        }
    }
}

/// Whether a replayed request must not be applied again.
pub fn changes_state(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::OpenSlab | Opcode::CloseSlab | Opcode::Write | Opcode::WriteV | Opcode::Discard
    )
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResumeError {
    #[error("no such session (it expired, or the donor restarted)")]
    Unknown,
    #[error("the session table is full")]
    Full,
}

/// Make room by forgetting the session detached longest ago, so that
/// clients that connect and leave (probes, short tools) cannot fill the
/// table and lock others out. False if every session has a connection.
fn evict_oldest_detached(map: &mut HashMap<u64, Arc<Session>>) -> bool {
    let oldest =
        map.iter().filter_map(|(id, s)| s.progress.lock().detached_at.map(|t| (t, *id))).min();
    oldest.is_some_and(|(_, id)| map.remove(&id).is_some())
}

/// Every live session of the server, bounded.
pub struct Sessions {
    map: Mutex<HashMap<u64, Arc<Session>>>,
    sessions_max: usize,
    window_len: usize,
}

impl Sessions {
    pub fn new(sessions_max: usize, window_len: usize) -> Sessions {
        assert!(sessions_max > 0 && window_len > 0);
        Sessions { map: Mutex::new(HashMap::new()), sessions_max, window_len }
    }

    /// A new session for `borrower`, attached, at epoch 1.
    pub fn create(
        &self,
        id: u64,
        borrower: BorrowerId,
    ) -> Result<(Arc<Session>, u64), ResumeError> {
        let mut map = self.map.lock();
        if map.len() >= self.sessions_max && !evict_oldest_detached(&mut map) {
            return Err(ResumeError::Full);
        }
        let none = Done { seq: 0, status: Status::Ok, value: 0 };
        let progress = Progress {
            epoch: 1,
            applied_seq: 0,
            window: vec![none; self.window_len].into(),
            attached: true,
            detached_at: None,
        };
        let s = Arc::new(Session { id, borrower, progress: Mutex::new(progress) });
        map.insert(id, Arc::clone(&s));
        Ok((s, 1))
    }

    /// Take over session `id` for `borrower`: a new epoch, which fences off
    /// any older connection. Returns the session, the epoch and the last
    /// request applied.
    pub fn resume(
        &self,
        id: u64,
        borrower: BorrowerId,
    ) -> Result<(Arc<Session>, u64, u64), ResumeError> {
        let s = self.map.lock().get(&id).cloned().ok_or(ResumeError::Unknown)?;
        if s.borrower != borrower {
            return Err(ResumeError::Unknown);
        }
        let mut p = s.progress.lock();
        p.epoch += 1;
        p.attached = true;
        p.detached_at = None;
        let (epoch, applied) = (p.epoch, p.applied_seq);
        drop(p);
        Ok((s, epoch, applied))
    }

    /// Forget sessions with no connection for longer than `grace` (their
    /// slabs go at the same age).
    pub fn reap(&self, grace: Duration) {
        self.map.lock().retain(|_, s| {
            let p = s.progress.lock();
            p.attached || p.detached_at.is_none_or(|t| t.elapsed() < grace)
        });
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_fences_the_old_epoch_and_reports_progress() {
        let table = Sessions::new(4, 8);
        let b = [1u8; 16];
        let (s, e1) = table.create(7, b).unwrap();
        s.lock().record(Done { seq: 1, status: Status::Ok, value: 42 });
        let (s2, e2, applied) = table.resume(7, b).unwrap();
        assert!(Arc::ptr_eq(&s, &s2) && e2 > e1 && applied == 1);
        assert_eq!(s.lock().result(1).unwrap().value, 42);
        assert_eq!(s.lock().result(9), None, "seq 9 shares a slot with 1 but is not it");
        // The old connection's detach does not detach the new one.
        s.detach(e1);
        table.reap(Duration::ZERO);
        assert_eq!(table.len(), 1);
        s.detach(e2);
        table.reap(Duration::ZERO);
        assert_eq!(table.len(), 0);
        assert_eq!(table.resume(7, b).err(), Some(ResumeError::Unknown));
    }

    #[test]
    fn another_borrower_cannot_resume_and_the_table_is_bounded() {
        let table = Sessions::new(1, 8);
        let (s, epoch) = table.create(7, [1u8; 16]).unwrap();
        assert_eq!(table.resume(7, [2u8; 16]).err(), Some(ResumeError::Unknown));
        assert_eq!(table.create(8, [1u8; 16]).err(), Some(ResumeError::Full));
        // A detached session makes room for a new one.
        s.detach(epoch);
        table.create(9, [3u8; 16]).unwrap();
        assert_eq!(table.resume(7, [1u8; 16]).err(), Some(ResumeError::Unknown));
        assert_eq!(table.len(), 1);
    }
}
