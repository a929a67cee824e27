//! The server: one thread that holds every shared segment of a run and
//! answers the faults of every process that maps one. It takes segments
//! offered on its socket, reads the faults and fork events of all their
//! userfaultfds, and keeps the resident pages of all segments within the
//! budget (set from outside, e.g. by what `--mem` leaves).

use super::bits::Bits;
use super::link;
use super::order::Order;
use super::segment::{Segment, Served};
use super::stats::SharedStats;
use crate::kernel::memfd::Memfd;
use crate::kernel::uffd::{wait_any, Msg, Uffd};
use memlend_store::{PageStore, PAGE_SIZE};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The most segments served at once.
pub const SEGMENTS_MAX: usize = 256;
/// How long the loop sleeps with nothing to do before it looks at the
/// budget and the stop flag again.
const IDLE_MS: i32 = 50;
/// Pages an eviction frees beyond what is needed now, so that the next
/// faults find room.
const EVICT_AHEAD_PAGES: usize = 16;
/// How often the server looks whether the processes of each segment are
/// still there: a segment no process maps any more is dropped, its store
/// with it.
const LOOK_ALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Opens a store of so many pages for a new segment.
pub type OpenStore = Box<dyn FnMut(u64) -> Result<Arc<dyn PageStore>, String> + Send>;

/// Whether a process may hand segments over (its pid, as the kernel says).
pub type AcceptPeer = Box<dyn Fn(u32) -> bool + Send>;

pub struct ServerConfig {
    /// Resident pages of all segments together; the server evicts past it.
    pub budget_pages: Arc<AtomicU64>,
    pub open_store: OpenStore,
    /// The socket may be open to other users (a program that changes
    /// user, as PostgreSQL's server must): only these processes are served.
    pub accept_peer: AcceptPeer,
}

/// The running server; stop it with [`Server::stop`].
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<SharedStats>,
}

impl Server {
    /// Listen at `sock` (a new path) and serve on a thread of its own.
    pub fn start(sock: &Path, config: ServerConfig) -> io::Result<Server> {
        let listener = UnixListener::bind(sock)?;
        listener.set_nonblocking(true)?;
        let stats = Arc::new(SharedStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut state = Loop {
            listener,
            config,
            segments: Vec::new(),
            stats: Arc::clone(&stats),
            buf: vec![0; super::evict::BATCH_PAGES_MAX * PAGE_SIZE],
            evict_stalled: false,
            next_id: 0,
        };
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("memlend-shared".into())
            .spawn(move || state.run(&flag))?;
        Ok(Server { stop, thread: Some(thread), stats })
    }

    /// Stop serving. A segment that a process still maps has its far pages
    /// brought home first, so that no page reads as zeroes once its
    /// faults are no longer served.
    pub fn stop(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Loop {
    listener: UnixListener,
    config: ServerConfig,
    segments: Vec<Segment>,
    stats: Arc<SharedStats>,
    buf: Vec<u8>,
    /// An eviction could not go this turn (a fork under way, the store
    /// failing): no more tries until the next turn has read the messages.
    evict_stalled: bool,
    /// The last segment's number (they start at 1; 0 means "new").
    next_id: u32,
}

impl Loop {
    /// Serve until stopped; then, or if serving panics, let go of every
    /// segment with its far pages home, so that no process reads zeroes.
    fn run(&mut self, stop: &AtomicBool) {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve(stop)));
        if served.is_err() {
            tracing::error!("the shared-memory server failed; its segments become local memory");
        }
        self.let_go();
    }

    fn serve(&mut self, stop: &AtomicBool) {
        let mut ready = Vec::new();
        let mut msgs = [Msg::default(); 16];
        let mut looked = std::time::Instant::now();
        while !stop.load(Relaxed) {
            self.evict_stalled = false;
            if looked.elapsed() >= LOOK_ALIVE_EVERY {
                self.drop_unmapped();
                looked = std::time::Instant::now();
            }
            let fds: Vec<BorrowedFd<'_>> = std::iter::once(self.listener.as_fd())
                .chain(self.segments.iter().flat_map(|s| s.mms.iter().map(|u| u.as_fd())))
                .collect();
            if let Err(e) = wait_any(&fds, IDLE_MS, &mut ready) {
                tracing::error!("shared-memory server: poll failed: {e}");
                break;
            }
            drop(fds);
            if ready[0] {
                self.accept();
            }
            self.read_faults(&ready[1..], &mut msgs);
            // The budget may have fallen (`--mem` follows the rest).
            self.keep_budget(0);
            for seg in &mut self.segments {
                seg.forget(&[]);
            }
        }
    }

    fn accept(&mut self) {
        // Bounded: one turn takes at most a few offers.
        for _ in 0..8 {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return tracing::warn!("shared-memory server: accept: {e}"),
            };
            match self.take(&stream) {
                Ok(id) => link::answer(&stream, Some(id)),
                Err(why) => {
                    tracing::warn!("shared segment refused: {why}");
                    SharedStats::add(&self.stats.segments_refused, 1);
                    link::answer(&stream, None);
                }
            }
        }
    }

    /// One hello: a new segment, or a forked child joining one. Returns
    /// the segment's number.
    fn take(&mut self, stream: &std::os::unix::net::UnixStream) -> Result<u32, String> {
        let _ = stream.set_nonblocking(false);
        let peer = crate::kernel::fdpass::peer_pid(stream).map_err(|e| e.to_string())?;
        if !(self.config.accept_peer)(peer) {
            return Err(format!("process {peer} is not one of the program's"));
        }
        let (hello, mut fds) = link::take(stream)?;
        let uffd = Uffd::from_fd(fds.pop().expect("link::take counted them"));
        if hello.join != 0 {
            let seg = (self.segments.iter_mut())
                .find(|s| s.id == hello.join)
                .ok_or_else(|| format!("no segment {} to join", hello.join))?;
            if seg.base as u64 != hello.base || u64::from(seg.pages) * PAGE_SIZE as u64 != hello.len
            {
                return Err(format!(
                    "segment {} is not at {:#x}+{}",
                    hello.join, hello.base, hello.len
                ));
            }
            seg.forked(uffd);
            return Ok(hello.join);
        }
        if self.segments.len() >= SEGMENTS_MAX {
            return Err(format!("{SEGMENTS_MAX} segments are served already"));
        }
        let memfd = Memfd::from_fd(fds.pop().expect("link::take counted them"));
        let size = memfd.len_bytes().map_err(|e| e.to_string())?;
        if size < hello.len {
            return Err(format!("the memfd holds {size} bytes, the hello says {}", hello.len));
        }
        let pages = (hello.len / PAGE_SIZE as u64) as u32;
        // Segments whose processes are all gone may still hold the room
        // (they are looked for once a second): PostgreSQL's initdb leaves
        // three just before the server makes its own, and the donor had no
        // room for it.
        let store = match (self.config.open_store)(u64::from(pages)) {
            Ok(store) => store,
            Err(_) if self.drop_unmapped() > 0 => (self.config.open_store)(u64::from(pages))?,
            Err(e) => return Err(e),
        };
        tracing::info!(pid = hello.pid, bytes = hello.len, "shared segment taken");
        SharedStats::add(&self.stats.segments, 1);
        SharedStats::add(&self.stats.segments_taken, 1);
        SharedStats::add(&self.stats.segment_bytes, hello.len);
        SharedStats::add(&self.stats.processes, 1);
        self.next_id += 1;
        self.segments.push(Segment {
            id: self.next_id,
            memfd,
            base: hello.base as usize,
            pages,
            mms: vec![uffd],
            gone: vec![false],
            store,
            far: Bits::new(pages),
            order: Order::new(pages),
            stats: Arc::clone(&self.stats),
        });
        Ok(self.next_id)
    }

    /// Read and serve the messages of every ready descriptor (`ready` in
    /// the order of the segments' descriptors).
    fn read_faults(&mut self, ready: &[bool], msgs: &mut [Msg; 16]) {
        let mut at = 0;
        for s in 0..self.segments.len() {
            let mms = self.segments[s].mms.len();
            let mut gone = vec![false; mms];
            let mut forks = Vec::new();
            for (mm, lost) in gone.iter_mut().enumerate() {
                if ready.get(at + mm).copied().unwrap_or(false) {
                    *lost = !self.serve_one(s, mm, msgs, &mut forks);
                }
            }
            at += mms;
            let seg = &mut self.segments[s];
            seg.forget(&gone);
            for child in forks {
                seg.forked(child);
            }
        }
    }

    /// Serve what process `mm` of segment `s` has; fork events leave their
    /// children's descriptors in `forks`. `false`: the process is gone.
    fn serve_one(
        &mut self,
        s: usize,
        mm: usize,
        msgs: &mut [Msg; 16],
        forks: &mut Vec<Uffd>,
    ) -> bool {
        let n = match self.segments[s].mms[mm].read_msgs(msgs) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("shared segment: a process's descriptor failed: {e}");
                return false;
            }
        };
        // Room first, so that the pages placed now keep within the budget.
        let misses = msgs[..n].iter().filter(|m| matches!(m, Msg::Fault(f) if !f.wp)).count();
        self.keep_budget(misses as u64);
        let seg = &mut self.segments[s];
        let mut alive = true;
        for msg in &msgs[..n] {
            match *msg {
                Msg::Fault(fault) => alive &= seg.serve(mm, fault, &mut self.buf) != Served::Gone,
                Msg::Fork { fd } => forks.push(Uffd::from_fork_event(fd)),
                // Not asked for on a segment's descriptor.
                Msg::Remove { .. } | Msg::Unmap { .. } | Msg::Remap { .. } => {}
            }
        }
        alive
    }

    /// Evict from the segment with the most resident pages until `coming`
    /// more fit the budget, and then some: an eviction moves a batch, not
    /// a page at a time.
    fn keep_budget(&mut self, coming: u64) {
        let budget = self.config.budget_pages.load(Relaxed);
        // Bounded: each turn moves pages out or stops.
        for _ in 0..1024 {
            if self.evict_stalled {
                return;
            }
            let resident = SharedStats::get(&self.stats.resident_pages);
            if resident + coming <= budget {
                return;
            }
            let Some(seg) = self.segments.iter_mut().max_by_key(|s| s.order.resident()) else {
                return;
            };
            let want = (resident + coming - budget) as usize + EVICT_AHEAD_PAGES;
            if seg.evict(want, &mut self.buf) == 0 {
                self.evict_stalled = true;
                return;
            }
        }
    }

    /// Segments no process maps any more go, with their stores. Returns
    /// how many went.
    fn drop_unmapped(&mut self) -> usize {
        let before = self.segments.len();
        self.segments.retain_mut(|seg| {
            let alive = seg.look_alive();
            if !alive {
                tracing::info!("a shared segment is mapped nowhere any more: dropped");
            }
            alive
        });
        before - self.segments.len()
    }

    /// The server stops: processes still mapping a segment keep all of
    /// it, in the memfd, once their descriptors close.
    fn let_go(&mut self) {
        self.drop_unmapped();
        for mut seg in self.segments.drain(..) {
            let home = seg.bring_home(&mut self.buf);
            if home > 0 {
                SharedStats::add(&self.stats.brought_home, home);
                tracing::info!("a shared segment outlived the run: {home} far pages came home");
            }
        }
    }
}
