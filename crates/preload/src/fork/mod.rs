//! fork of a process with far memory (redis's BGSAVE, for one), with
//! `memlend run --follow-fork on`, the default (with `off` the region is
//! MADV_DONTFORK and a child has no far memory).
//!
//! The child must see the region as it was at the fork, while the parent
//! goes on changing it. Around fork (pthread_atfork, registered at load so
//! that ours run first in the child and last before the fork):
//!
//! - before: the parent's handler settles and parks (`Region::pause_lazy`,
//!   or `Region::pause` with `--fork-clean eager`), the
//!   store starts keeping the old bytes of every page it alone holds
//!   (a snapshot, `memlend_store::layer::snapshot`), and a socket pair is
//!   made;
//! - in the parent: the handler goes on, and a thread answers the child's
//!   requests for pages from the snapshot until the child exits or execs,
//!   then releases it; with a lazy clean the handler writes the dirty
//!   pages the child shares between faults, the snapshot owes each once
//!   written, and another thread tells the child, which drops its copy;
//! - in the child: before any other fork handler can touch the region, a
//!   handler of the child's own serves it (`memlend_fault::serve_child`):
//!   the pages that were mapped are shared by the kernel, the others come
//!   through the socket.
//!
//! The design note is "Forked children" in docs/run.md.

pub(crate) mod serve;
mod watch;

use crate::heap::Heap;
use memlend_fault::{
    serve_child, ChildRegion, ChildSource, Discarded, ForkWritten, LinkSource, Paused,
};
use memlend_store::file::{FileOptions, FileStore};
use memlend_store::layer::snapshot::{LateOwed, Owed};
use memlend_store::PAGE_SIZE;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};

/// A child keeps at most this share of the parent's budget of the pages it
/// reads in and does not write. Under `--mem` the parent gives up as much
/// while the child lives. redis's BGSAVE at 50/50 in a 258 MiB memcg read
/// 1.0 M pages through the parent at a sixteenth (FIFO), 795 K at a
/// quarter (FIFO), 690 K at an eighth with S3-FIFO (`child_cache.rs`); but
/// at an eighth the parent served 0.6-0.7x the operations of a sixteenth
/// (`fork_bgsave4.json`, `fork_bgsave5.json`)...
const CHILD_BUDGET_DIV: usize = 16;
/// ...and at least this many.
const CHILD_BUDGET_PAGES_MIN: usize = 256;
/// Under `--mem`, what a child needs besides its budget: its copies of the
/// pages of the rest of the process that either one writes, its page
/// tables, the parent's buffers for keeping old pages.
const CHILD_ROOM_BYTES: u64 = 8 << 20;

/// What `before` made, for `in_parent` or `in_child`.
struct Pending {
    paused: Paused<'static>,
    /// None if the store could not keep another snapshot: the child's far
    /// pages then fail (SIGBUS) rather than read wrong.
    snapshot: Option<u64>,
    in_store: Vec<u64>,
    parent_end: UnixStream,
    child_end: UnixStream,
    /// A lazy clean's pending pages, and how the child hears of their
    /// writes (`Notices`).
    pending: Vec<u64>,
    notices: Option<Notices>,
}

/// The parent's side of telling a child which pending pages are written:
/// the handler's sink sends page lists here, and a thread of the parent's
/// passes them on to the child's socket (the handler must never wait on a
/// child that is slow to read).
struct Notices {
    lists: std::sync::mpsc::Receiver<Vec<u32>>,
    parent_end: UnixStream,
    child_end: UnixStream,
    /// Set when the child's link ends (it exited or exec'd).
    child_gone: Arc<AtomicBool>,
}

/// The handler's sink for a lazy clean: the snapshot owes each written
/// page from now on, then the child hears of it. Neither waits: the owed
/// bits take no lock (the snapshot layer's may be held across spill file
/// I/O), and the lists go through a channel.
struct NoticeSink {
    late: Arc<LateOwed>,
    lists: std::sync::mpsc::Sender<Vec<u32>>,
    child_gone: Arc<AtomicBool>,
}

impl ForkWritten for NoticeSink {
    fn written(&mut self, pages: &[u32]) -> bool {
        if self.child_gone.load(Relaxed) {
            return false;
        }
        self.late.owe(pages);
        self.lists.send(pages.to_vec()).is_ok()
    }
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);
/// One fork at a time goes through `before`..`in_parent`.
static FORKING: AtomicBool = AtomicBool::new(false);
/// Children served, for the report.
pub static CHILDREN: AtomicU64 = AtomicU64::new(0);
/// In a forked child: the pages it threw away, which read zero.
static DISCARDED: OnceLock<Arc<Discarded>> = OnceLock::new();

/// The far heap's arena, held by the forking thread across the fork, so
/// that a child finds it whole: its realloc and malloc_usable_size of the
/// parent's blocks read it, and another thread's allocation cut in half
/// would leave it locked for ever in the child. (Not a thread-local: its
/// destructor's registration is allocated by glibc inside the fork
/// handlers, then freed through the program's allocator at exit; jemalloc
/// crashed on that.)
static ARENA_HELD: Mutex<Option<HeldArena>> = Mutex::new(None);

struct HeldArena(#[allow(dead_code)] std::sync::MutexGuard<'static, crate::arena::Arena>);

// SAFETY: the guard is taken in `before` and dropped in `in_parent` or
// `in_child`, all run by the forking thread (the child's one thread is
// that thread's copy); `FORKING` keeps forks one at a time.
unsafe impl Send for HeldArena {}

fn hold_arena(heap: &'static Heap) {
    let guard = HeldArena(heap.arena());
    *ARENA_HELD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
}

fn release_arena() {
    let held = ARENA_HELD.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(held);
}

fn pending() -> std::sync::MutexGuard<'static, Option<Pending>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Register the fork handlers. Called once, at load.
pub fn register() {
    // SAFETY: registers plain functions, run around every fork.
    unsafe { libc::pthread_atfork(Some(before), Some(in_parent), Some(in_child)) };
}

extern "C" fn before() {
    crate::thread_kind::while_ours(before_fork);
}

extern "C" fn in_parent() {
    crate::thread_kind::while_ours(after_fork_in_parent);
}

extern "C" fn in_child() {
    // Shared segments first: nothing of the program's runs before they
    // are served here, whether or not the far heap follows the fork.
    crate::thread_kind::while_ours(crate::shared::after_fork_in_child);
    crate::thread_kind::while_ours(after_fork_in_child);
}

fn before_fork() {
    let Some(heap) = crate::far::ready_heap().filter(|_| crate::far::follows_fork()) else {
        return;
    };
    // Bounded by the other fork's time between its `before` and `in_parent`.
    while FORKING.swap(true, SeqCst) {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    watch::fork_begins();
    // Taken before the pause: no thread holds it while it waits on the
    // handler (the heap's frees discard pages outside it).
    hold_arena(heap);
    match prepare(heap) {
        Ok(p) => *pending() = Some(p),
        Err(e) => {
            tracing::error!("fork: far memory cannot follow the child: {e:#}");
            watch::fork_done();
            FORKING.store(false, SeqCst);
        }
    }
}

fn prepare(heap: &'static Heap) -> anyhow::Result<Pending> {
    ensure_spill(heap);
    make_room_for_child(heap);
    let lazy = crate::far::lazy_fork_clean();
    let paused = if lazy { heap.region.pause_lazy()? } else { heap.region.pause()? };
    let pages = heap.region.len() as u64 / PAGE_SIZE as u64;
    let mut owed = Owed::new(pages);
    (0..pages).filter(|&p| paused.in_store(p)).for_each(|p| owed.set(p));
    let snapshot = match heap.snapshots.take(owed) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::error!("fork: {e}; the child's far pages will fail");
            None
        }
    };
    let (parent_end, child_end) = UnixStream::pair()?;
    let in_store = paused.in_store_bits().to_vec();
    let pending = paused.pending_bits().to_vec();
    let late = snapshot.and_then(|id| heap.snapshots.late_owed(id));
    let notices = match late {
        Some(late) if pending.iter().any(|&w| w != 0) => Some(lazy_sink(&paused, late)?),
        // No sink: the pending pages stay dirty and the child shares them.
        _ => None,
    };
    Ok(Pending { paused, snapshot, in_store, parent_end, child_end, pending, notices })
}

/// Give the paused handler a sink for its lazy clean, whose pages the
/// snapshot owes `late`.
fn lazy_sink(paused: &Paused<'_>, late: Arc<LateOwed>) -> std::io::Result<Notices> {
    let (parent_end, child_end) = UnixStream::pair()?;
    let (tx, lists) = std::sync::mpsc::channel();
    let child_gone = Arc::new(AtomicBool::new(false));
    paused.clean_lazily(Box::new(NoticeSink {
        late,
        lists: tx,
        child_gone: Arc::clone(&child_gone),
    }));
    Ok(Notices { lists, parent_end, child_end, child_gone })
}

/// In the parent: pass the written pages' lists on to the child until the
/// handler is done with them (it drops the sink) or the child is gone.
fn pass_notices(lists: std::sync::mpsc::Receiver<Vec<u32>>, mut to_child: UnixStream) {
    use std::io::Write;
    // Bounded: ends when the sink is dropped; each turn is one list.
    for pages in lists.iter() {
        let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        if to_child.write_all(&bytes).is_err() {
            return; // the child is gone; the sink hears so from the link
        }
    }
}

/// A child's budget, in pages, for a parent whose budget is `parent_pages`.
fn child_budget_pages(parent_pages: usize) -> usize {
    (parent_pages / CHILD_BUDGET_DIV).max(CHILD_BUDGET_PAGES_MIN)
}

/// Under `--mem`: hold room for the child for `ROOM_HOLD` and lower the far
/// budget by it now (the pause evicts down to it). Without `--mem` the
/// child's memory is its own, as a forked child's is.
fn make_room_for_child(heap: &Heap) {
    if !crate::far::mem_limited() {
        return;
    }
    let budget_pages = heap.region.handler_stats().budget_pages as usize;
    let room = (child_budget_pages(budget_pages) * PAGE_SIZE) as u64 + CHILD_ROOM_BYTES;
    crate::mem_limit::hold_for_child(room);
    let room_pages = (room / PAGE_SIZE as u64) as usize;
    heap.region.set_budget_pages(budget_pages.saturating_sub(room_pages));
}

/// The first fork: give the snapshots a file on local disk to keep old
/// bytes in, so that a parent rewriting its pages while a child reads does
/// not hold them in memory. Failing that, they are kept in memory (logged).
fn ensure_spill(heap: &Heap) {
    if heap.snapshots.has_spill() {
        return;
    }
    let Some(dir) = crate::far::fork_spill_dir() else { return };
    let path = dir.join(format!(".memlend-fork-{}.spill", std::process::id()));
    // Room for every page twice (two children at once); sparse until used.
    let pages = 2 * (heap.region.len() / PAGE_SIZE) as u64;
    let create = |direct| FileStore::create(&path, pages, FileOptions { direct });
    let store = create(true).or_else(|_| create(false));
    // Unlinked at once: the file lives as long as the descriptor.
    let _ = std::fs::remove_file(&path);
    match store {
        Ok(store) => {
            heap.snapshots.set_spill(Box::new(store));
        }
        Err(e) => tracing::warn!(
            "fork: no spill file in {} ({e}); the old bytes a child owes are kept in memory",
            dir.display()
        ),
    }
}

fn after_fork_in_parent() {
    release_arena();
    let Some(p) = pending().take() else { return };
    let Pending { paused, snapshot, parent_end, child_end, notices, .. } = p;
    drop(child_end);
    let number = paused.number();
    drop(paused);
    watch::fork_done();
    FORKING.store(false, SeqCst);
    let child_gone = notices.map(|n| {
        drop(n.child_end);
        let (lists, to_child) = (n.lists, n.parent_end);
        let spawned = std::thread::Builder::new()
            .name("memlend-notice".into())
            .spawn(move || pass_notices(lists, to_child));
        if let Err(e) = spawned {
            // The sink's sends fail, and the handler stops: the child keeps
            // sharing what is left.
            tracing::error!("fork: no thread to tell the child of written pages: {e}");
        }
        n.child_gone
    });
    let (Some(heap), Some(id)) = (crate::far::ready_heap(), snapshot) else { return };
    CHILDREN.fetch_add(1, Relaxed);
    serve::spawn(heap, id, number, parent_end, child_gone);
}

fn after_fork_in_child() {
    release_arena();
    let Some(heap) = crate::far::ready_heap() else { return };
    crate::far::became_child();
    if !crate::far::follows_fork() {
        return; // the region is MADV_DONTFORK: not here at all
    }
    let pages = (heap.region.len() / PAGE_SIZE) as u32;
    type Shared = (Vec<u64>, Option<UnixStream>);
    let (in_store, source, (pending, notices)): (Vec<u64>, Box<dyn ChildSource>, Shared) =
        match pending().take() {
            Some(p) => {
                let Pending { paused, in_store, parent_end, child_end, pending, notices, .. } = p;
                drop(parent_end);
                // The parent's pause lives in the parent; the copy here ends nothing.
                std::mem::forget(paused);
                let notices = notices.map(|n| {
                    // The receiver's copy here is never read: forgotten, as
                    // the sink's in the handler's pause is.
                    std::mem::forget(n.lists);
                    drop(n.parent_end);
                    n.child_end
                });
                (in_store, Box::new(LinkSource::new(child_end)), (pending, notices))
            }
            // The parent could not hold its handler still (logged there): no
            // page not mapped now can be trusted, so each one fails (SIGBUS)
            // rather than read as zeroes.
            None => {
                let all = vec![u64::MAX; (pages as usize).div_ceil(64)];
                (all, Box::new(Refused), (Vec::new(), None))
            }
        };
    // Without notices the child never learns a pending page is written:
    // it keeps sharing them all.
    let pending = if notices.is_some() { pending } else { Vec::new() };
    FORKING.store(false, SeqCst);
    let discarded = Arc::new(Discarded::new(pages));
    let _ = DISCARDED.set(Arc::clone(&discarded));
    let budget = heap.region.handler_stats().budget_pages as usize;
    let region = ChildRegion {
        base: heap.region.as_ptr() as usize,
        pages,
        in_store,
        budget_pages: child_budget_pages(budget),
        discarded,
        pending,
        notices,
    };
    // A grandchild is not followed (its parent, this child, has no store
    // to keep a snapshot in): it gets no copy of the region at all, so a
    // touch faults (SIGSEGV) rather than reading zeroes.
    let (base, len) = (region.base as *mut libc::c_void, heap.region.len());
    // SAFETY: advice on the region's own mapping; it changes no contents.
    if unsafe { crate::sys::madvise(base, len, libc::MADV_DONTFORK) } != 0 {
        tracing::warn!("forked child: MADV_DONTFORK: {}", std::io::Error::last_os_error());
    }
    if let Err(e) = serve_child(region, source) {
        // Nothing serves the region's missing pages: touching one would
        // wait for ever, so the child cannot go on.
        eprintln!("memlend: forked child: no handler for far memory ({e}); exiting");
        // SAFETY: ends this process at once.
        unsafe { libc::_exit(127) };
    }
}

/// A child's source when the parent could not follow the fork.
struct Refused;

impl ChildSource for Refused {
    fn read(&mut self, _pages: &[u32], _out: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("the parent could not keep its far memory for this child"))
    }
}

/// In a forked child, before the program drops pages of the region: they
/// must read zero afterwards, not the bytes the parent's store held.
pub fn child_discards(addr: usize, len: usize) {
    let (Some(discarded), Some(heap)) = (DISCARDED.get(), crate::far::any_heap()) else { return };
    let base = heap.region.as_ptr() as usize;
    let first = (addr.saturating_sub(base) / PAGE_SIZE) as u32;
    let end = (addr + len).saturating_sub(base).div_ceil(PAGE_SIZE) as u32;
    discarded.set_range(first, end.saturating_sub(first));
}
