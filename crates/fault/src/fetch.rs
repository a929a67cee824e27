//! Prefetch reads on their own thread. The handler hands over one window's
//! pages and goes on (making room for them, serving faults) while this
//! thread reads them from the store; the handler maps them when the read is
//! done. Before, the handler itself waited for every window's read, and a
//! sequential scan left a core idle a quarter of the time.
//!
//! Two windows may be in flight, so that the store reads the next while the
//! handler maps the last. Their pages stay `InStore` until mapped,
//! and nothing may change them meanwhile, or the read could bring back
//! bytes that are no longer theirs. The handler keeps that promise by
//! finishing the fetch (waiting for it and mapping it) before anything that
//! could: a fault on one of its pages, the next prefetch, and any event
//! (remove, unmap, remap). Eviction never touches a page that is not mapped.

use crate::mem::PageBuf;
use memlend_store::{PageStore, ReadOp, StoreResult, PAGE_SIZE};
use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One window: sorted pages and, once read, their bytes in that order.
/// Windows in flight at most.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

pub(crate) struct Fetch {
    pub pages: Vec<u32>,
    /// One of the handler's `MAX_IN_FLIGHT` window buffers.
    pub buf: PageBuf,
    pub result: StoreResult<()>,
}

pub(crate) struct Fetcher {
    /// `None` once shut down.
    jobs: Option<SyncSender<Fetch>>,
    done: Receiver<Fetch>,
    thread: Option<JoinHandle<()>>,
    /// The pages of each window in flight (sorted), oldest first; the
    /// thread answers them in this order.
    in_flight: VecDeque<Vec<u32>>,
}

impl Fetcher {
    pub(crate) fn start(store: Arc<dyn PageStore>) -> std::io::Result<Fetcher> {
        // The channels never hold more than the jobs in flight.
        let (jobs, job_rx) = sync_channel::<Fetch>(MAX_IN_FLIGHT);
        let (done_tx, done) = sync_channel::<Fetch>(MAX_IN_FLIGHT);
        let thread = std::thread::Builder::new().name("memlend-fetch".into()).spawn(move || {
            for mut job in job_rx {
                job.result = read_runs(store.as_ref(), &job.pages, &mut job.buf);
                if done_tx.send(job).is_err() {
                    return;
                }
            }
        })?;
        let in_flight = VecDeque::with_capacity(MAX_IN_FLIGHT);
        Ok(Fetcher { jobs: Some(jobs), done, thread: Some(thread), in_flight })
    }

    pub(crate) fn busy(&self) -> bool {
        !self.in_flight.is_empty()
    }

    pub(crate) fn full(&self) -> bool {
        self.in_flight.len() == MAX_IN_FLIGHT
    }

    /// Whether `page` is in a window in flight.
    pub(crate) fn holds(&self, page: u32) -> bool {
        self.in_flight.iter().any(|pages| pages.binary_search(&page).is_ok())
    }

    /// Start reading `pages` (sorted, non-empty) into `buf`.
    pub(crate) fn send(&mut self, pages: Vec<u32>, buf: PageBuf) {
        assert!(!self.full(), "at most MAX_IN_FLIGHT windows in flight");
        debug_assert!(pages.is_sorted());
        self.in_flight.push_back(pages.clone());
        let jobs = self.jobs.as_ref().expect("the fetcher runs while the handler does");
        // Never blocks (one job at most); fails only if the thread died,
        // which `wait` then reports.
        let _ = jobs.send(Fetch { pages, buf, result: Ok(()) });
    }

    /// The oldest window, if it is read, without waiting.
    pub(crate) fn try_done(&mut self) -> Option<Fetch> {
        if !self.busy() {
            return None;
        }
        match self.done.try_recv() {
            Ok(fetch) => Some(self.finished(fetch)),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
        }
    }

    /// Wait for the oldest window in flight; None if there is none.
    pub(crate) fn wait(&mut self) -> Option<Fetch> {
        if !self.busy() {
            return None;
        }
        let fetch = self.done.recv().expect("the fetch thread never exits while a job waits");
        Some(self.finished(fetch))
    }

    fn finished(&mut self, fetch: Fetch) -> Fetch {
        let pages = self.in_flight.pop_front();
        debug_assert_eq!(pages.as_ref(), Some(&fetch.pages), "answered in order");
        fetch
    }
}

impl Drop for Fetcher {
    /// Close the queue and join the thread; it ends after the read in hand.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One store read for `pages` (sorted), runs of consecutive pages joined.
fn read_runs(store: &dyn PageStore, pages: &[u32], buf: &mut PageBuf) -> StoreResult<()> {
    let mut ops = Vec::with_capacity(pages.len());
    let mut rest = buf.bytes_mut(pages.len() * PAGE_SIZE);
    for run in runs(pages) {
        let (bytes, tail) = rest.split_at_mut(run.len() * PAGE_SIZE);
        ops.push(ReadOp { page: u64::from(run[0]), buf: bytes });
        rest = tail;
    }
    store.read(&mut ops)
}

/// Maximal runs of consecutive page numbers in sorted `pages`.
pub(crate) fn runs(pages: &[u32]) -> impl Iterator<Item = &[u32]> {
    pages.chunk_by(|a, b| b.checked_sub(*a) == Some(1))
}
