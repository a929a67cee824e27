//! What the shim says: warnings and errors on stderr (filtered by
//! MEMLEND_LOG, `warn` by default so a program's own output stays its own),
//! and the region's counters in `<stats dir>/<pid>.json` at exit, which
//! `memlend run` sums up after the program ends (and, while it runs, in
//! the live file `memlend top` reads: `live.rs`).

use crate::far;
use memlend_store::PAGE_SIZE;
use std::fmt::Write;

pub fn init_logging() {
    let filter = tracing_subscriber_filter();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn tracing_subscriber_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("MEMLEND_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
}

/// Register the exit report, if `memlend run` asked for one, and the word
/// to the donors that this process is exiting.
pub fn at_exit() {
    extern "C" fn report() {
        crate::live::remove();
        if let Err(e) = write_stats() {
            eprintln!("memlend: cannot write far-memory stats: {e}");
        }
        // Only the process that borrowed: a forked child inherits this
        // handler, and its exit must not shorten its parent's grace.
        if far::owner_pid() == Some(std::process::id()) {
            memlend_remote::linger_all(0);
        }
    }
    // SAFETY: registers a plain function to run at normal exit.
    unsafe { libc::atexit(report) };
}

fn write_stats() -> std::io::Result<()> {
    let Some(dir) = far::stats_dir() else { return Ok(()) };
    let Some(j) = stats_json() else { return Ok(()) };
    let path = dir.join(format!("{}.json", std::process::id()));
    std::fs::write(path, j)
}

/// The counters so far, into `<stats dir>/<pid>.last.json` (each second, by
/// the live thread): a process that ends without running its exit handlers
/// (killed; or a Go program, whose exit skips libc's) still leaves them.
pub fn write_last(json: &str) {
    let Some(dir) = far::stats_dir() else { return };
    let pid = std::process::id();
    let (path, next) = (dir.join(format!("{pid}.last.json")), dir.join(format!(".{pid}.last.new")));
    let _ = std::fs::write(&next, json).and_then(|_| std::fs::rename(&next, &path));
}

/// The region's counters as one JSON object (the exit report, and the live
/// file `memlend top` reads); None before far memory started.
pub fn stats_json() -> Option<String> {
    let heap = far::heap()?;
    let s = heap.region.stats();
    let h = heap.region.handler_stats();
    let (peak_pages, live_pages) = {
        let arena = heap.arena();
        (arena.peak_pages(), arena.live_pages())
    };
    let mut j = String::new();
    let _ = write!(
        j,
        "{{\"pid\":{},\"written_unix_ms\":{},\"store\":{:?},\"far_bytes\":{},\"peak_far_bytes\":{},\"live_far_bytes\":{},",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
        heap.describe,
        heap.region.len(),
        peak_pages * PAGE_SIZE as u64,
        live_pages * PAGE_SIZE as u64,
    );
    let _ = write!(
        j,
        "\"faults_zero_filled\":{},\"faults_from_store\":{},\"pages_written_back\":{},\
         \"pages_clean_dropped\":{},\"pages_zero_dropped\":{},\"faults_write_protect\":{},\
         \"pages_poisoned\":{},\"pages_resident\":{},\"pages_prefetched\":{},\
         \"prefetch_hits\":{},\"prefetch_wasted\":{},\"pages_zeroed_ahead\":{},\
         \"faults_waited_on_fetch\":{},\"faults_from_staging\":{},\"handler_moves\":{},\
         \"fault_store_read_ns\":{},\"fault_map_ns\":{},",
        s.faults_zero_filled,
        s.faults_from_store,
        s.pages_written_back,
        s.pages_clean_dropped,
        s.pages_zero_dropped,
        s.faults_write_protect,
        s.pages_poisoned,
        s.pages_resident,
        h.pages_prefetched,
        h.prefetch_hits,
        h.prefetch_wasted,
        h.pages_zeroed_ahead,
        h.faults_waited_on_fetch,
        h.faults_from_staging,
        h.handler_moves,
        h.fault_store_read_ns,
        h.fault_map_ns,
    );
    let _ = write!(
        j,
        "\"faults_from_pool\":{},\"fault_pool_read_ns\":{},\"fault_pool_map_ns\":{},\
         \"pool_pages_stored\":{},\"pool_pages_incompressible\":{},\"pool_pages_dropped\":{},\
         \"pool_ghost_hits\":{},\"pool_pages_held\":{},\"pool_bytes_held\":{},\
         \"pool_charged_pages\":{},\"pool_limit_pages\":{},\
         \"fault_store_latency_ns_p50\":{},\"fault_store_latency_ns_p99\":{},\
         \"fault_store_latency_ns_p999\":{},\"fault_pool_latency_ns_p50\":{},\
         \"fault_pool_latency_ns_p99\":{},\"fault_pool_latency_ns_p999\":{},\
         \"budget_pages\":{},\"peak_rss_bytes\":{},\"staging_waits\":{},\"staging_wait_ns\":{},\"pool_pages_skipped\":{},\
         \"block_reads\":{},\"pages_read_beside\":{},\"block_pages\":{},\
         \"shared_reads\":{},\"faults_read_along\":{},\
         \"huge_collapsed\":{},\"huge_failed\":{},\
         \"eviction_batches\":{},\"eviction_batches_ahead\":{},\"evictions_on_fault\":{},\
         \"reserve_pages\":{},\"mem_cgroup_limit_bytes\":{},\
         \"fault_store_read_ns_p99\":{},\"fault_room_ns_p99\":{},\"fault_map_ns_p99\":{},",
        h.faults_from_pool,
        h.fault_pool_read_ns,
        h.fault_pool_map_ns,
        h.pool_pages_stored,
        h.pool_pages_incompressible,
        h.pool_pages_dropped,
        h.pool_ghost_hits,
        h.pool_pages_held,
        h.pool_bytes_held,
        h.pool_charged_pages,
        h.pool_limit_pages,
        h.fault_store_latency_ns_p50,
        h.fault_store_latency_ns_p99,
        h.fault_store_latency_ns_p999,
        h.fault_pool_latency_ns_p50,
        h.fault_pool_latency_ns_p99,
        h.fault_pool_latency_ns_p999,
        h.budget_pages,
        peak_rss_bytes(),
        h.staging_waits,
        h.staging_wait_ns,
        h.pool_pages_skipped,
        h.block_reads,
        h.pages_read_beside,
        h.block_pages,
        h.shared_reads,
        h.faults_read_along,
        h.huge_collapsed,
        h.huge_failed,
        s.eviction_batches,
        h.eviction_batches_ahead,
        h.evictions_on_fault,
        h.reserve_pages,
        crate::mem_limit::CGROUP_LIMIT_BYTES.load(std::sync::atomic::Ordering::Relaxed),
        h.fault_store_read_ns_p99,
        h.fault_room_ns_p99,
        h.fault_map_ns_p99,
    );
    let snapshots = heap.snapshots.stats();
    let _ = write!(
        j,
        "\"forks\":{},\"fork_children\":{},\"fork_pages_sent\":{},\"fork_pages_copied\":{},\"pages_unshared\":{},\"pages_unshared_ahead\":{},\
         \"fork_kept_pages_peak\":{},\"fork_pages_cleaned\":{},\"fork_pages_cleaned_after\":{},\"fork_snapshots_given_up\":{},\"fork_pause_ms\":{},\"fork_pause_evict_ms\":{},\"fork_pause_dirty_ms\":{},",
        h.forks,
        crate::fork::CHILDREN.load(std::sync::atomic::Ordering::Relaxed),
        crate::fork::serve::PAGES_SENT.load(std::sync::atomic::Ordering::Relaxed),
        crate::fork::serve::PAGES_COPIED.load(std::sync::atomic::Ordering::Relaxed),
        h.pages_unshared,
        h.pages_unshared_ahead,
        snapshots.kept_pages_peak,
        h.pages_cleaned_for_fork,
        h.pages_cleaned_after_fork,
        snapshots.given_up,
        h.fork_pause_ns / 1_000_000,
        h.fork_pause_evict_ns / 1_000_000,
        h.fork_pause_dirty_ns / 1_000_000,
    );
    let m = heap.copies.stats();
    let _ = write!(
        j,
        "\"copy_legs\":{},\"copy_legs_failed\":{},\"copy_rebuilds\":{},\"copy_bad\":{},\"copy_pages_lost\":{},",
        m.legs, m.leg_failures, m.rebuilds, m.bad_copies, m.lost_pages
    );
    // The layers' lines are plain ASCII (names and numbers), which Debug
    // quotes as JSON does.
    let lines: Vec<String> = heap.reports.iter().map(|r| format!("{:?}", r())).collect();
    j.push_str(&crate::seen::json_members());
    let _ = write!(j, "\"layer_reports\":[{}]}}", lines.join(","));
    Some(j)
}

/// The process's peak resident set (VmHWM), 0 if unreadable.
fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    let line = status.lines().find(|l| l.starts_with("VmHWM:"));
    let kib = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}
