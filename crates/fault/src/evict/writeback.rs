//! Write-back on its own thread. Eviction moves dirty victims into one half
//! of the staging mapping and hands that half to this thread, which writes
//! them to the store while the handler goes on serving faults. The handler
//! uses the other half meanwhile; it waits only if both are being written.
//! A fault on a page still being written is served from its staging copy
//! (`evict/mod.rs`), and that page's result is then ignored.
//!
//! Order: one thread writes the jobs in the order they were sent, each to
//! completion, so a page evicted twice reaches the store in the same order.
//!
//! With the compressed pool on, this thread also compresses the job's pages
//! whose store copy is current once it is done (clean ones, and dirty ones
//! written), off the fault path; the handler puts them in the pool when it
//! settles the job (`evict/mod.rs`).

use crate::kernel::doorbell::Doorbell;
use crate::kernel::mem::Mapping;
use crate::reserve::HALVES;
use crate::zpool::{Packed, Packer};
use memlend_store::{PageStore, StoreResult, WriteOp};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One half's dirty pages, to write, and clean ones, only to compress; as
/// (staging slot, page), slots absolute.
pub(crate) struct Job {
    pub half: usize,
    pub staged: Vec<(usize, u32)>,
    /// Clean victims to compress for the pool (not written).
    pub clean: Vec<(usize, u32)>,
    /// Per `staged` page: compress it for the pool once written.
    pub pool_staged: Vec<bool>,
}

pub(crate) struct Done {
    pub half: usize,
    pub staged: Vec<(usize, u32)>,
    pub result: StoreResult<()>,
    /// The write alone, which sizes the batches.
    pub took: Duration,
    /// Compressed copies for the pool (empty with the pool off).
    pub packed: Packed,
}

pub(crate) struct Writer {
    /// `None` once shut down.
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    busy: [bool; HALVES],
}

impl Writer {
    pub(crate) fn start(
        store: Arc<dyn PageStore>,
        staging: Arc<Mapping>,
        bell: Arc<Doorbell>,
        mut packer: Option<Packer>,
    ) -> std::io::Result<Writer> {
        // At most one job per half is ever outstanding.
        let (jobs, job_rx) = sync_channel::<Job>(HALVES);
        let (done_tx, done) = sync_channel::<Done>(HALVES);
        let thread =
            std::thread::Builder::new().name("memlend-writeback".into()).spawn(move || {
                for job in job_rx {
                    let started = Instant::now();
                    let result = write_back(store.as_ref(), &staging, &job.staged);
                    let took = started.elapsed();
                    let mut packed = Packed::default();
                    if let Some(packer) = packer.as_mut() {
                        let written = if result.is_ok() { &job.staged[..] } else { &[] };
                        let admitted = written.iter().zip(&job.pool_staged).filter(|(_, &a)| a);
                        for &(slot, page) in job.clean.iter().chain(admitted.map(|(s, _)| s)) {
                            packer.pack(page, staging.present_pages(slot, 1), &mut packed);
                        }
                    }
                    let done = Done { half: job.half, staged: job.staged, result, took, packed };
                    if done_tx.send(done).is_err() {
                        return;
                    }
                    bell.ring();
                }
            })?;
        Ok(Writer { jobs: Some(jobs), done, thread: Some(thread), busy: [false; HALVES] })
    }

    /// A half that no job holds, if any.
    pub(crate) fn free_half(&self) -> Option<usize> {
        self.busy.iter().position(|&busy| !busy)
    }

    pub(crate) fn any_busy(&self) -> bool {
        self.busy.iter().any(|&busy| busy)
    }

    pub(crate) fn send(&mut self, job: Job) {
        assert!(!self.busy[job.half], "a half is handed out once at a time");
        self.busy[job.half] = true;
        let jobs = self.jobs.as_ref().expect("the writer runs while the handler does");
        // The channel holds one job per half, so this never blocks; it fails
        // only if the thread died, which `wait` then reports.
        let _ = jobs.send(job);
    }

    /// A finished job, without waiting.
    pub(crate) fn try_done(&mut self) -> Option<Done> {
        match self.done.try_recv() {
            Ok(done) => Some(self.finished(done)),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
        }
    }

    /// Wait for a job to finish; None if none is outstanding.
    pub(crate) fn wait(&mut self) -> Option<Done> {
        if !self.any_busy() {
            return None;
        }
        let done = self.done.recv().expect("the write-back thread never exits while jobs wait");
        Some(self.finished(done))
    }

    fn finished(&mut self, done: Done) -> Done {
        self.busy[done.half] = false;
        done
    }
}

impl Drop for Writer {
    /// Close the queue and join the thread; it ends after the job in hand.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One store `write` for the staged (slot, page) pairs, with runs of
/// consecutive pages in consecutive slots joined into one op. Nothing to
/// write is no call at all.
pub(crate) fn write_back(
    store: &dyn PageStore,
    staging: &Mapping,
    staged: &[(usize, u32)],
) -> StoreResult<()> {
    if staged.is_empty() {
        return Ok(());
    }
    let mut ops: Vec<WriteOp<'_>> = Vec::with_capacity(staged.len());
    let mut run_start = 0;
    for i in 1..=staged.len() {
        let joins = i < staged.len()
            && staged[i].0 == staged[i - 1].0 + 1
            && staged[i].1 == staged[i - 1].1 + 1;
        if !joins {
            ops.push(WriteOp {
                page: u64::from(staged[run_start].1),
                data: staging.present_pages(staged[run_start].0, i - run_start),
            });
            run_start = i;
        }
    }
    store.write(&ops)
}
