//! One shared segment as the server holds it: its memfd, the userfaultfd
//! of every process that maps it (the maker's, then one per fork), its
//! store, which pages are far (a hole in the memfd, their bytes in the
//! store), and its resident pages in the order they came in.

use super::bits::Bits;
use super::order::Order;
use super::stats::SharedStats;
use crate::kernel::memfd::Memfd;
use crate::kernel::uffd::{retry_eagain, Fault, Uffd};
use memlend_store::{PageStore, ReadOp, PAGE_SIZE};
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// The most processes one segment is served in (a fork past it is still
/// served: see `Segment::forked`).
pub(crate) const PROCESSES_MAX: usize = 4096;

pub(crate) struct Segment {
    /// The server's number for it.
    pub(crate) id: u32,
    pub(crate) memfd: Memfd,
    pub(crate) base: usize,
    pub(crate) pages: u32,
    /// One per process that maps it; dropped when its process is gone.
    pub(crate) mms: Vec<Uffd>,
    /// Processes found gone by an eviction, dropped at [`Segment::forget`]
    /// (not at once: the server may be walking `mms` by index then).
    pub(crate) gone: Vec<bool>,
    pub(crate) store: Arc<dyn PageStore>,
    /// In the store, not in the memfd.
    pub(crate) far: Bits,
    /// The resident pages placed here, and which leave first.
    pub(crate) order: Order,
    pub(crate) stats: Arc<SharedStats>,
}

/// What one fault came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Served {
    /// The page is in the memfd now, placed by us.
    Placed,
    /// Someone placed it first, or it was a stale write-protect fault:
    /// the faulting thread was woken.
    Woken,
    /// The process is gone.
    Gone,
}

impl Segment {
    pub(crate) fn page_of(&self, addr: usize) -> Option<u32> {
        let page = addr.checked_sub(self.base)? / PAGE_SIZE;
        (page < self.pages as usize).then_some(page as u32)
    }

    fn addr(&self, page: u32) -> usize {
        self.base + page as usize * PAGE_SIZE
    }

    /// Serve a fault of process `mm`: a far page from the store, any other
    /// as zeroes; a write-protect fault left from an eviction is lifted.
    pub(crate) fn serve(&mut self, mm: usize, fault: Fault, buf: &mut [u8]) -> Served {
        let Some(page) = self.page_of(fault.addr) else {
            let _ = self.mms[mm].wake(fault.addr & !(PAGE_SIZE - 1), PAGE_SIZE);
            return Served::Woken;
        };
        let addr = self.addr(page);
        let uffd = &self.mms[mm];
        if fault.wp {
            // Eviction write-protects its victims in every process while it
            // copies them out; a write that met that waits here and is let
            // go once they are gone (it then faults them back) or stayed.
            return match uffd.unprotect(addr, PAGE_SIZE) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Served::Gone,
                _ => Served::Woken,
            };
        }
        let placed = if self.far.get(page) {
            let buf = &mut buf[..PAGE_SIZE];
            let mut op = [ReadOp { page: u64::from(page), buf }];
            if let Err(e) = self.store.read(&mut op) {
                return self.lost(mm, page, &e.to_string());
            }
            SharedStats::add(&self.stats.store_reads, 1);
            retry_eagain(|| uffd.copy(addr, &op[0].buf[..], false))
        } else {
            retry_eagain(|| uffd.zeropage(addr, PAGE_SIZE))
        };
        self.settle(mm, page, placed)
    }

    fn settle(&mut self, mm: usize, page: u32, placed: io::Result<()>) -> Served {
        let addr = self.addr(page);
        match placed {
            Ok(()) => {
                let came_back = self.far.get(page);
                if came_back {
                    self.far.set(page, false);
                    SharedStats::sub(&self.stats.far_pages, 1);
                } else {
                    SharedStats::add(&self.stats.zero_fills, 1);
                }
                self.order.placed(page, came_back);
                SharedStats::add(&self.stats.resident_pages, 1);
                Served::Placed
            }
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Served::Gone,
            Err(e) => {
                // EEXIST: placed first through another process; EAGAIN: the
                // address space is changing (a fork): the thread, woken,
                // faults again.
                if !matches!(e.raw_os_error(), Some(libc::EEXIST | libc::EAGAIN)) {
                    tracing::warn!("shared page {page}: placing it failed: {e}");
                }
                let _ = self.mms[mm].wake(addr, PAGE_SIZE);
                Served::Woken
            }
        }
    }

    /// The store cannot give `page`: the thread that needs it gets SIGBUS
    /// (never zeroes in place of data).
    fn lost(&mut self, mm: usize, page: u32, why: &str) -> Served {
        tracing::error!(
            "shared page {page}: the store cannot give it ({why}); SIGBUS to its reader"
        );
        let addr = self.addr(page);
        let _ = self.mms[mm].poison(addr, PAGE_SIZE);
        let _ = self.mms[mm].wake(addr, PAGE_SIZE);
        SharedStats::add(&self.stats.pages_poisoned, 1);
        Served::Woken
    }

    /// A process that maps the segment forked: its child's descriptor.
    pub(crate) fn forked(&mut self, child: Uffd) {
        if self.mms.len() >= PROCESSES_MAX {
            tracing::warn!(
                "a shared segment is mapped in {PROCESSES_MAX} processes; more are still served"
            );
        }
        self.mms.push(child);
        self.gone.push(false);
        SharedStats::add(&self.stats.processes, 1);
    }

    /// Drop the descriptors of processes that are gone (`gone[i]`, or
    /// found gone by an eviction).
    pub(crate) fn forget(&mut self, gone: &[bool]) {
        let before = self.mms.len();
        let mut i = 0;
        let marked = std::mem::take(&mut self.gone);
        self.mms.retain(|_| {
            let keep = !gone.get(i).copied().unwrap_or(false) && !marked[i];
            i += 1;
            keep
        });
        self.gone = vec![false; self.mms.len()];
        SharedStats::sub(&self.stats.processes, (before - self.mms.len()) as u64);
    }

    /// Drop the descriptors of processes that are gone or no longer map
    /// the segment's first page; true if any process still maps it.
    pub(crate) fn look_alive(&mut self) -> bool {
        let gone: Vec<bool> = (self.mms.iter())
            .map(|uffd| match uffd.unprotect(self.base, PAGE_SIZE) {
                Err(e) => matches!(e.raw_os_error(), Some(libc::ESRCH | libc::ENOENT)),
                Ok(()) => false,
            })
            .collect();
        self.forget(&gone);
        !self.mms.is_empty()
    }

    /// Before the server lets go of the segment while a process may still
    /// map it: every far page back into the memfd. Returns the pages that
    /// came home.
    pub(crate) fn bring_home(&mut self, buf: &mut [u8]) -> u64 {
        let mut home = 0;
        for page in 0..self.pages {
            if !self.far.get(page) {
                continue;
            }
            let buf = &mut buf[..PAGE_SIZE];
            let mut op = [ReadOp { page: u64::from(page), buf }];
            let offset = u64::from(page) * PAGE_SIZE as u64;
            match self.store.read(&mut op) {
                Ok(()) => match self.memfd.write_at(&op[0].buf[..], offset) {
                    Ok(()) => {
                        self.far.set(page, false);
                        home += 1;
                    }
                    Err(e) => tracing::error!("shared page {page}: cannot bring it home: {e}"),
                },
                Err(e) => tracing::error!("shared page {page}: the store cannot give it: {e}"),
            }
        }
        SharedStats::sub(&self.stats.far_pages, home);
        home
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        SharedStats::sub(&self.stats.resident_pages, u64::from(self.order.resident()));
        SharedStats::sub(&self.stats.processes, self.mms.len() as u64);
        let _ = self.stats.segments.fetch_sub(1, Relaxed);
    }
}
