//! A forked child's far pages (`serve_child`).
//!
//! A child gets the parent's address space as it was at the fork: the pages
//! then mapped are shared with the parent (copied on write by the kernel),
//! and the rest of the region is missing. The parent's handler does not
//! come with the child (threads do not survive fork, and the parent's
//! userfaultfd registration is not inherited), so this is the child's own:
//! a thread with a userfaultfd of its own that serves each missing page
//! either as zeroes (the page was empty at the fork, or the child threw it
//! away since) or with the bytes the store held at the fork, which the
//! child reads through its parent (`ChildSource`).
//!
//! Memory: the pages the fork shared whose bytes the store keeps are
//! dropped at once (`drop_shared`), so only pages the parent could not
//! write out stay shared. The pages it brings in are mapped write-protected;
//! one the child has not written may be dropped again (MADV_DONTNEED, which this
//! descriptor asks no event for) and read again later. So a child that
//! reads everything (redis's BGSAVE) holds at most `budget_pages` of the
//! pages it read, plus those it wrote.
//!
//! Failure: a page the parent cannot give is poisoned, and the touching
//! thread gets SIGBUS: the child dies, it does not hang or read wrong bytes.

use super::cache::ChildCache;
use super::source::{ChildSource, LINK_PAGES_MAX};
use crate::kernel::uffd::{Msg, Uffd};
use memlend_store::PAGE_SIZE;
use std::io;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Pages a forked child threw away (MADV_DONTNEED, free): they read as
/// zero from then on, whatever the store held. One bit a page, set by the
/// thread that discards before it does.
pub struct Discarded {
    bits: Vec<AtomicU64>,
}

impl Discarded {
    pub fn new(pages: u32) -> Discarded {
        Discarded { bits: (0..(pages as usize).div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    pub fn set_range(&self, first: u32, count: u32) {
        for page in first..first.saturating_add(count) {
            if let Some(word) = self.bits.get(page as usize / 64) {
                word.fetch_or(1 << (page % 64), Relaxed);
            }
        }
    }

    fn has(&self, page: u32) -> bool {
        self.bits.get(page as usize / 64).is_some_and(|w| w.load(Relaxed) & (1 << (page % 64)) != 0)
    }
}

/// What the child's handler starts from.
pub struct ChildRegion {
    pub base: usize,
    pub pages: u32,
    /// The pages whose bytes at the fork the store keeps (one bit a page,
    /// as `Paused::in_store_bits`): read through the parent, never shared.
    pub in_store: Vec<u64>,
    /// Pages read in and not written that the child keeps mapped at most.
    pub budget_pages: usize,
    pub discarded: Arc<Discarded>,
    /// The pages a lazy pause left dirty (`Paused::pending_bits`; empty for
    /// none): shared until the parent says on `notices` that the store has
    /// their bytes, then dropped unless the child wrote them.
    pub pending: Vec<u64>,
    /// Where the parent says which pending pages are written: u32 page
    /// numbers, little-endian, until it closes its end.
    pub notices: Option<UnixStream>,
}

/// Pages read from the parent in one request at most: the missing faults
/// of one read of the descriptor.
const BATCH_PAGES_MAX: usize = LINK_PAGES_MAX;

/// In the forked child, before anything touches the region: register it
/// with a userfaultfd of the child's own and start the thread that serves
/// it. The thread lives as long as the process.
pub fn serve_child(region: ChildRegion, source: Box<dyn ChildSource>) -> io::Result<()> {
    let uffd = Uffd::open_child()?;
    uffd.register(region.base, region.pages as usize * PAGE_SIZE, true)?;
    drop_shared(&region)?;
    let mut region = region;
    if let Err(e) = protect_pending(&uffd, &region) {
        // Unprotected, a write of the child's would go unseen: it keeps
        // every pending page instead (memory, not bytes, is lost).
        tracing::warn!("forked child: write-protecting the pages it shares: {e}");
        region.pending.clear();
    }
    let cache = ChildCache::new(region.pages, region.budget_pages);
    let server = ChildServer {
        uffd,
        region,
        source,
        written: vec![false; 0],
        cache,
        buf: vec![0; BATCH_PAGES_MAX * PAGE_SIZE],
        notice_buf: Vec::with_capacity(NOTICE_BYTES_MAX),
    };
    std::thread::Builder::new().name("memlend-child".into()).spawn(move || server.run())?;
    Ok(())
}

/// Unmap, in the child, every page the fork shared whose bytes the store
/// keeps for it (`in_store`): the parent may then evict its own copy
/// without the child holding the old one in memory, and the child holds
/// no more than its budget. It reads them again through its parent.
fn drop_shared(region: &ChildRegion) -> io::Result<()> {
    let mut mapped = Vec::new();
    crate::kernel::mem::mapped_pages(region.base, region.pages as usize, &mut mapped)?;
    let droppable = |page: usize| {
        mapped[page] && region.in_store.get(page / 64).is_some_and(|w| w & (1 << (page % 64)) != 0)
    };
    let mut page = 0;
    // Bounded: each turn moves past at least one page.
    while page < mapped.len() {
        if !droppable(page) {
            page += 1;
            continue;
        }
        let run = (page..mapped.len()).take_while(|&p| droppable(p)).count();
        let addr = region.base + page * PAGE_SIZE;
        // The raw syscall, as in `drop_over_budget`.
        // SAFETY: drops pages of the region, which this process's handler
        // serves again (from the parent) on their next touch.
        let rc =
            unsafe { libc::syscall(libc::SYS_madvise, addr, run * PAGE_SIZE, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        page += run;
    }
    Ok(())
}

/// Write-protect the pending pages, which the child shares with its
/// parent: a write of the child's own then faults, and marks the page
/// written, so it is never dropped for the parent's copy.
fn protect_pending(uffd: &Uffd, region: &ChildRegion) -> io::Result<()> {
    let pending = |page: usize| bit(&region.pending, page as u32);
    let mut page = 0;
    // Bounded: each turn moves past at least one page.
    while page < region.pages as usize {
        if !pending(page) {
            page += 1;
            continue;
        }
        let run = (page..region.pages as usize).take_while(|&p| pending(p)).count();
        uffd.protect(region.base + page * PAGE_SIZE, run * PAGE_SIZE)?;
        page += run;
    }
    Ok(())
}

fn bit(bits: &[u64], page: u32) -> bool {
    bits.get(page as usize / 64).is_some_and(|w| w & (1 << (page % 64)) != 0)
}

/// Bytes of notices read at once.
const NOTICE_BYTES_MAX: usize = 4096;

struct ChildServer {
    uffd: Uffd,
    region: ChildRegion,
    source: Box<dyn ChildSource>,
    /// Pages the child wrote after reading them in: never dropped.
    written: Vec<bool>,
    /// Pages read in and mapped, which to drop first (some may since be
    /// written; those are never dropped).
    cache: ChildCache,
    buf: Vec<u8>,
    /// Notices read and not yet whole (a page number split by a read).
    notice_buf: Vec<u8>,
}

impl ChildServer {
    fn run(mut self) {
        self.written = vec![false; self.region.pages as usize];
        // As the parent's handler does (`kernel/cpu.rs`): the faulting thread waits
        // while this one serves it, so they share a core, and the wake after
        // each page is not one across cores (15-50 us here).
        let mut follow = crate::kernel::cpu::Follow::new(true);
        let mut msgs = [Msg::default(); 16];
        loop {
            let ready = match wait_readable(&self.uffd, self.region.notices.as_ref()) {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::error!("forked child's fault handler: poll: {e}");
                    return;
                }
            };
            if ready.notices {
                self.take_notices();
            }
            if !ready.faults {
                continue;
            }
            let n = match self.uffd.read_msgs(&mut msgs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("forked child's fault handler: read: {e}");
                    return;
                }
            };
            for msg in &msgs[..n] {
                if let Msg::Fault(fault) = msg {
                    follow.fault(fault.tid);
                }
            }
            self.serve(&msgs[..n]);
        }
    }

    fn serve(&mut self, msgs: &[Msg]) {
        let mut wanted = Vec::with_capacity(BATCH_PAGES_MAX);
        for msg in msgs {
            let Msg::Fault(fault) = *msg else { continue };
            let Some(page) = self.page_of(fault.addr) else { continue };
            let addr = self.addr(page);
            if fault.wp {
                self.written[page as usize] = true;
                // A page dropped since is missing now: the woken writer
                // faults again and reads it in.
                if let Err(e) = self.uffd.unprotect(addr, PAGE_SIZE) {
                    report(page, "unprotect", Err(e));
                    report(page, "wake", self.uffd.wake(addr, PAGE_SIZE));
                }
            } else if self.reads_store(page) {
                if !wanted.contains(&page) {
                    wanted.push(page);
                }
            } else {
                report(
                    page,
                    "zero-fill",
                    resolve(&self.uffd, addr, || self.uffd.zeropage(addr, PAGE_SIZE)),
                );
            }
        }
        if wanted.is_empty() {
            return;
        }
        let bytes = &mut self.buf[..wanted.len() * PAGE_SIZE];
        if let Err(e) = self.source.read(&wanted, bytes) {
            tracing::error!(
                "forked child: reading {} far pages from the parent: {e}",
                wanted.len()
            );
            for &page in &wanted {
                let addr = self.addr(page);
                report(
                    page,
                    "poison",
                    resolve(&self.uffd, addr, || self.uffd.poison(addr, PAGE_SIZE)),
                );
            }
            return;
        }
        for (i, &page) in wanted.iter().enumerate() {
            let addr = self.addr(page);
            let src = &self.buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            report(page, "copy", resolve(&self.uffd, addr, || self.uffd.copy(addr, src, true)));
            self.cache.read_in(page);
        }
        self.drop_over_budget();
    }

    /// Read what the parent says it has written, and drop the pending
    /// pages named that the child has not written nor thrown away: they
    /// are read through the parent from now on. A write of the child's
    /// racing the drop waits on this thread (its WP fault), finds the page
    /// gone, and reads it in.
    fn take_notices(&mut self) {
        let Some(stream) = self.region.notices.as_mut() else { return };
        let had = self.notice_buf.len();
        self.notice_buf.resize(NOTICE_BYTES_MAX, 0);
        let n = match stream.read(&mut self.notice_buf[had..]) {
            Ok(0) => {
                self.region.notices = None; // the parent is done
                0
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => {
                tracing::error!("forked child: reading the parent's notices: {e}");
                self.region.notices = None;
                0
            }
        };
        self.notice_buf.truncate(had + n);
        let whole = self.notice_buf.len() / 4 * 4;
        let pages: Vec<u32> = self.notice_buf[..whole]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        self.notice_buf.drain(..whole);
        for page in pages {
            self.written_by_parent(page);
        }
    }

    fn written_by_parent(&mut self, page: u32) {
        let Some(word) = self.region.pending.get_mut(page as usize / 64) else { return };
        let bit = 1u64 << (page % 64);
        if *word & bit == 0 {
            return;
        }
        *word &= !bit;
        if self.written[page as usize] || self.region.discarded.has(page) {
            return; // the child's own bytes now: kept
        }
        let addr = self.addr(page);
        // The raw syscall, as in `drop_over_budget`.
        // SAFETY: drops one page of the region, which this thread serves
        // again (from the parent) on its next touch.
        let rc = unsafe { libc::syscall(libc::SYS_madvise, addr, PAGE_SIZE, libc::MADV_DONTNEED) };
        if rc != 0 {
            tracing::warn!("forked child: dropping page {page}: {}", io::Error::last_os_error());
            return;
        }
        if let Some(w) = self.region.in_store.get_mut(page as usize / 64) {
            *w |= bit;
        }
    }

    /// Read from the store (through the parent) rather than zero-filled.
    fn reads_store(&self, page: u32) -> bool {
        let in_store = self.region.in_store.get(page as usize / 64);
        in_store.is_some_and(|w| w & (1 << (page % 64)) != 0) && !self.region.discarded.has(page)
    }

    /// Drop pages read in and not written while more than the budget are
    /// kept (`fork/child/cache.rs` picks which). A write racing the drop waits on
    /// this thread (its WP fault), finds the page gone, and reads it in
    /// again.
    fn drop_over_budget(&mut self) {
        // Bounded: each turn takes one page out of the cache.
        while let Some(page) = self.cache.victim() {
            if self.written[page as usize] {
                continue;
            }
            let addr = self.addr(page);
            // The raw syscall: the shim's `madvise` would count this as the
            // program's own discard. This descriptor asks no REMOVE events.
            // SAFETY: drops one page of the region, which this thread serves.
            let rc =
                unsafe { libc::syscall(libc::SYS_madvise, addr, PAGE_SIZE, libc::MADV_DONTNEED) };
            if rc != 0 {
                tracing::warn!(
                    "forked child: dropping page {page}: {}",
                    io::Error::last_os_error()
                );
            }
        }
    }

    fn page_of(&self, addr: usize) -> Option<u32> {
        let page = addr.wrapping_sub(self.region.base) / PAGE_SIZE;
        (page < self.region.pages as usize).then_some(page as u32)
    }

    fn addr(&self, page: u32) -> usize {
        self.region.base + page as usize * PAGE_SIZE
    }
}

fn resolve(uffd: &Uffd, addr: usize, call: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    crate::kernel::uffd::resolve(uffd, addr, call)
}

fn report(page: u32, what: &str, result: io::Result<()>) {
    if let Err(e) = result {
        tracing::error!("forked child: {what} of far page {page} failed: {e}");
    }
}

struct ChildReady {
    faults: bool,
    notices: bool,
}

/// How long the child's handler polls, yielding, for its next fault before
/// it sleeps: a `BGSAVE` child faults every few microseconds, and a wake
/// across cores costs 15-50 us on these VMs (see `fork/child/link.rs`).
const FAULT_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

fn wait_readable(uffd: &Uffd, notices: Option<&UnixStream>) -> io::Result<ChildReady> {
    let pollfd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let mut fds = [pollfd(uffd.as_fd().as_raw_fd()), pollfd(-1)];
    let count = match notices {
        Some(stream) => {
            fds[1].fd = stream.as_raw_fd();
            2
        }
        None => 1,
    };
    let spin_until = std::time::Instant::now() + FAULT_SPIN;
    // Bounded: a sleeping poll from `spin_until` on; each turn is one poll.
    loop {
        let spinning = std::time::Instant::now() < spin_until;
        // SAFETY: `count` valid pollfds.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, if spinning { 0 } else { -1 }) };
        if rc == 0 && spinning {
            std::thread::yield_now();
            continue;
        }
        if rc >= 0 {
            // A closed or failed notice socket reads as its end.
            let notices = count == 2 && fds[1].revents != 0;
            return Ok(ChildReady { faults: fds[0].revents != 0, notices });
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}
