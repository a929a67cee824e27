//! The far heap: one far-memory region, made on the first large allocation,
//! carved into page-granular blocks by the arena. Every function here is
//! called from the exported allocator symbols; `None`/`false` from them means
//! "not far memory, pass through".

use crate::config::Config;
pub use crate::heap::Heap;
use anyhow::{Context, Result};
use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_store::layer::snapshot::Snapshots;
use memlend_store::PAGE_SIZE;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};
use std::sync::OnceLock;

const UNCONFIGURED: u8 = 0;
const INERT: u8 = 1;
const CONFIGURED: u8 = 2;
const STARTING: u8 = 3;
const READY: u8 = 4;
const FAILED: u8 = 5;
/// A forked child: the region is the parent's, served by the child's own
/// handler (`fork/`); large allocations go local.
const CHILD: u8 = 6;

static STATE: AtomicU8 = AtomicU8::new(UNCONFIGURED);
/// Sizes from this up are far; `usize::MAX` while inert.
pub static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
static CONFIG: OnceLock<Config> = OnceLock::new();
static HEAP: OnceLock<Heap> = OnceLock::new();
/// The process's resident set when the heap was made (`--mem`).
static START_REST: AtomicUsize = AtomicUsize::new(0);

/// What runs around the heap's start, set at load time by `lib.rs`: the
/// heap's life cycle does not depend on what reports on it or follows it.
pub struct Hooks {
    /// Before the region is made (logging).
    pub before: fn(),
    /// Once it is ready: the heap, the settings, the process's resident set
    /// when it was made.
    pub ready: fn(&'static Heap, &Config, u64),
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();

/// Read the environment once, at load time, before `main`.
pub fn configure(hooks: Hooks) {
    let _ = HOOKS.set(hooks);
    match crate::config::from_env() {
        Ok(Some(cfg)) => {
            THRESHOLD.store(cfg.threshold_bytes, Relaxed);
            let _ = CONFIG.set(cfg);
            STATE.store(CONFIGURED, Relaxed);
        }
        Ok(None) => STATE.store(INERT, Relaxed),
        Err(e) => {
            eprintln!("memlend: far memory is off: {e:#}");
            STATE.store(INERT, Relaxed);
        }
    }
}

/// Is `addr` inside the far region (of this process)?
pub fn contains(addr: usize) -> bool {
    addr.wrapping_sub(BASE.load(Relaxed)) < LEN.load(Relaxed)
}

/// The process that made the heap (0 until then).
static OWNER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The process that borrowed far memory, once it has.
pub fn owner_pid() -> Option<u32> {
    Some(OWNER_PID.load(Relaxed)).filter(|&pid| pid != 0)
}

/// Where the exit report goes, if anywhere.
pub fn stats_dir() -> Option<&'static std::path::Path> {
    CONFIG.get()?.stats_dir.as_deref()
}

/// The heap, made on first use. A thread that finds it being made by
/// another (or by itself, allocating while it makes it) passes through.
pub fn heap() -> Option<&'static Heap> {
    match STATE.load(Acquire) {
        READY => HEAP.get(),
        CONFIGURED => start(),
        _ => None,
    }
}

fn start() -> Option<&'static Heap> {
    if STATE.compare_exchange(CONFIGURED, STARTING, Acquire, Relaxed).is_err() {
        return None;
    }
    let cfg = CONFIG.get()?;
    match std::panic::catch_unwind(|| build(cfg)) {
        Ok(Ok(heap)) => {
            BASE.store(heap.region.as_ptr() as usize, Relaxed);
            let _ = HEAP.set(heap);
            LEN.store(HEAP.get()?.region.len(), Relaxed);
            OWNER_PID.store(std::process::id(), Relaxed);
            STATE.store(READY, std::sync::atomic::Ordering::Release);
            let heap = HEAP.get()?;
            if let Some(h) = HOOKS.get() {
                (h.ready)(heap, cfg, START_REST.load(Relaxed) as u64);
            }
            Some(heap)
        }
        Ok(Err(e)) => fail(&format!("{e:#}")),
        Err(_) => fail("panicked while starting"),
    }
}

fn fail(why: &str) -> Option<&'static Heap> {
    eprintln!("memlend: cannot start far memory: {why}; large allocations fail (ENOMEM)");
    STATE.store(FAILED, Relaxed);
    None
}

/// Large allocations fail (ENOMEM) rather than silently going local once
/// far memory was asked for and could not start: running out of local
/// memory is what the user came to avoid.
pub fn failed() -> bool {
    STATE.load(Relaxed) == FAILED
}

fn build(cfg: &Config) -> Result<Heap> {
    if let Some(h) = HOOKS.get() {
        (h.before)();
    }
    let opened = cfg.placement.open(cfg.far_bytes.map(|b| b.div_ceil(PAGE_SIZE as u64)))?;
    let pages = opened.pages.min(u64::from(u32::MAX));
    let start_rest = crate::mem_limit::rest_bytes(0);
    START_REST.store(start_rest as usize, Relaxed);
    let local_bytes = match cfg.mem_bytes {
        Some(mem) => crate::mem_limit::start_budget_bytes(mem, start_rest),
        None => cfg.local_bytes,
    };
    let mut budget_pages = (local_bytes / PAGE_SIZE as u64).max(1) as usize;
    let mut tuning = Tuning {
        compress: cfg.compress,
        pool_admits_all: cfg.pool_admits_all,
        pool_codec: cfg.pool_codec,
        huge_pages: cfg.huge_pages,
        batch_fault_reads: cfg.batch_fault_reads,
        ..Tuning::default()
    };
    if let Some(pages) = cfg.read_block_pages_max {
        tuning.read_block_pages_max = pages;
    }
    if let Some(pages) = cfg.prefetch_pages_max {
        tuning.prefetch_pages_max = pages;
    }
    if let Some(dir) = &cfg.trace_dir {
        tuning = Tuning::tracing(dir.join(format!("{}.trace", std::process::id())));
        budget_pages = memlend_fault::trace::WINDOW_PAGES;
    }
    let rc = RegionConfig {
        size_bytes: pages as usize * PAGE_SIZE,
        budget_pages,
        evict_batch_pages: RegionConfig::default().evict_batch_pages.min(budget_pages),
    };
    // The store keeps what a forked child still reads (`fork/`).
    let snapshots = std::sync::Arc::new(Snapshots::new(std::sync::Arc::clone(&opened.store)));
    let region = Region::with_tuning(rc, tuning, snapshots.clone()).context("far-memory region")?;
    if !cfg.follow_fork {
        // A forked child must not see a copy of the region without a
        // handler: pages not resident would read as zeroes. It sees nothing.
        // SAFETY: advice on a mapping this process owns; it changes no contents.
        let rc = unsafe {
            crate::sys::madvise(region.as_ptr().cast(), region.len(), libc::MADV_DONTFORK)
        };
        anyhow::ensure!(rc == 0, "madvise(MADV_DONTFORK): {}", std::io::Error::last_os_error());
    }
    tracing::info!(pages, budget_pages, "far memory on {}", opened.describe);
    Ok(Heap::new(region, snapshots, pages, opened.describe, opened.copies, opened.reports))
}

/// The heap, if it is made and this is the process that made it.
pub fn ready_heap() -> Option<&'static Heap> {
    (STATE.load(Acquire) == READY).then(|| HEAP.get()).flatten()
}

/// The heap as made, even in a forked child (where it serves nothing).
pub fn any_heap() -> Option<&'static Heap> {
    HEAP.get()
}

/// In a forked child: the parent's heap is not ours to allocate from.
pub fn became_child() {
    if STATE.load(Relaxed) == READY {
        STATE.store(CHILD, Relaxed);
    }
}

/// The heap is being made now (its own mappings are no program's).
pub fn starting() -> bool {
    STATE.load(Relaxed) == STARTING
}

/// In a forked child of the process that made the heap.
pub fn in_child() -> bool {
    STATE.load(Relaxed) == CHILD
}

/// `memlend run --follow-fork on`: a forked child sees far memory.
pub fn follows_fork() -> bool {
    CONFIG.get().is_some_and(|c| c.follow_fork)
}

/// `memlend run --fork-clean lazy`: a fork's dirty pages are written after it.
pub fn lazy_fork_clean() -> bool {
    CONFIG.get().is_some_and(|c| c.lazy_fork_clean)
}

/// `memlend run --mem`: the far budget follows the rest of the process.
pub fn mem_limited() -> bool {
    CONFIG.get().is_some_and(|c| c.mem_bytes.is_some())
}

/// `memlend run`'s shared-memory server, if it runs one.
pub fn shared_sock() -> Option<&'static std::path::Path> {
    CONFIG.get()?.shared_sock.as_deref()
}

/// `memlend run --fork-spill DIR`.
pub fn fork_spill_dir() -> Option<&'static std::path::Path> {
    CONFIG.get().map(|c| c.fork_spill_dir.as_path())
}
