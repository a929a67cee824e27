//! The LD_PRELOAD shim behind `memlend run`: an unmodified program's large
//! allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc,
//! memalign, valloc, pvalloc from `MEMLEND_THRESHOLD` up, 1 MiB by default,
//! anonymous private read-write mmap of that size, and `PROT_NONE`
//! reservations committed later, `reserve.rs`) are carved from one
//! far-memory region, whose pages beyond the local budget live on donors or
//! a local SSD file. Everything else goes straight to glibc or the kernel,
//! and what of it was large is named by kind in the run's summary
//! (`seen.rs`).
//!
//! - The region is made on the first large allocation, not at load, so the
//!   many small processes a shell script starts never open a store.
//! - The shim's own Rust code allocates from glibc's `__libc_*` functions
//!   (the global allocator below), so it cannot re-enter itself. The
//!   program's small allocations go to the next allocator in link order
//!   (glibc's, or the program's own, such as redis-server's jemalloc).
//! - fork: by default the child sees the region as it was at the fork,
//!   served by a handler of its own that reads far pages through its
//!   parent (`fork/`); with `--follow-fork off` the region is
//!   MADV_DONTFORK and a child has no far memory (a touch is SIGSEGV).
//!   Either way its new
//!   large allocations are local, and its frees of far blocks are no-ops. exec: a new program starts a region of its own if
//!   it makes large allocations.
//!
//! See docs/run.md.

// Unit tests build without the exported symbols (they would replace the
// test harness's own malloc), so the code only they reach looks dead there.
#![cfg_attr(test, allow(dead_code))]

mod arena;
mod config;
mod far;
mod fork;
mod heap;
mod libc_alloc;
mod live;
mod mem_limit;
mod next;
mod ops;
mod report;
mod reserve;
mod seen;
mod shared;
mod sys;
mod thread_kind;

#[cfg(not(test))]
mod exports;

#[cfg(not(test))]
#[global_allocator]
static GLOBAL: libc_alloc::LibcAlloc = libc_alloc::LibcAlloc;

/// Runs when the library is loaded, before the program's `main`.
#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static CONFIGURE: extern "C" fn() = {
    extern "C" fn configure() {
        // The one place the shim's fork handling is wired: at load, before
        // the program's allocator registers its own atfork handlers, so
        // ours run first in a child, before anything there touches far
        // memory (`fork/`).
        fork::register();
        far::configure(far::Hooks { before: report::init_logging, ready });
    }
    configure
};

/// Once the far heap is made: the exit report, the live file, and, with
/// `--mem`, the thread that follows the process's total.
#[cfg(not(test))]
fn ready(heap: &'static heap::Heap, cfg: &config::Config, start_rest_bytes: u64) {
    report::at_exit();
    seen::heap_started();
    live::start(|| {
        let json = report::stats_json()?;
        report::write_last(&json);
        Some(json)
    });
    if let Some(mem) = cfg.mem_bytes.filter(|_| cfg.trace_dir.is_none()) {
        mem_limit::follow(heap, mem, start_rest_bytes);
    }
}
