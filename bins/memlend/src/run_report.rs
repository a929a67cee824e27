//! The summary `memlend run` prints when the program ends: what far memory
//! did, summed over every process of the run that used it (each leaves
//! `<pid>.json` in the stats directory at exit).

use memlend_node::size::human;
use serde_json::Value;
use std::path::Path;
use std::process::ExitStatus;

/// Most process reports read: a fork bomb must not make us read forever.
const REPORTS_MAX: usize = 4096;

pub fn collect(dir: &Path) -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .take(REPORTS_MAX)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect()
}

fn sum(reports: &[Value], key: &str) -> u64 {
    reports.iter().filter_map(|r| r[key].as_u64()).sum()
}

pub fn print(
    cmd: &[String],
    status: &ExitStatus,
    elapsed_s: f64,
    local: u64,
    where_: &str,
    reports: &[Value],
) {
    let how = match status.code() {
        Some(code) => format!("exited {code}"),
        None => format!("was killed ({status})"),
    };
    eprintln!("memlend run: {} {how} after {elapsed_s:.1} s", cmd.join(" "));
    if reports.is_empty() {
        eprintln!("memlend run: no process made a large allocation; far memory was not used");
        return;
    }
    let peak = reports.iter().filter_map(|r| r["peak_far_bytes"].as_u64()).max().unwrap_or(0);
    eprintln!(
        "memlend run: far memory on {where_}: {} process(es), peak {} far with {} local each",
        reports.len(),
        human(peak),
        human(local)
    );
    eprintln!(
        "memlend run: faults: {} zero-filled, {} from the store; pages: {} prefetched, {} written back, {} clean dropped{}",
        sum(reports, "faults_zero_filled"),
        sum(reports, "faults_from_store"),
        sum(reports, "pages_prefetched"),
        sum(reports, "pages_written_back"),
        sum(reports, "pages_clean_dropped"),
        match sum(reports, "pages_poisoned") {
            0 => String::new(),
            n => format!("; {n} POISONED (store read failed)"),
        }
    );
    if sum(reports, "pages_prefetched") + sum(reports, "pages_zeroed_ahead") > 0 {
        eprintln!(
            "memlend run: prefetch: {} pages used, {} wasted, {} zero-filled ahead; {} faults waited for a read in flight, {} came back from write-back",
            sum(reports, "prefetch_hits"),
            sum(reports, "prefetch_wasted"),
            sum(reports, "pages_zeroed_ahead"),
            sum(reports, "faults_waited_on_fetch"),
            sum(reports, "faults_from_staging"),
        );
    }
    if sum(reports, "block_reads") > 0 {
        eprintln!(
            "memlend run: {} store faults read their aligned block too, {} pages beside them (blocks of up to {} pages at exit)",
            sum(reports, "block_reads"),
            sum(reports, "pages_read_beside"),
            reports.iter().filter_map(|r| r["block_pages"].as_u64()).max().unwrap_or(1),
        );
    }
    if sum(reports, "shared_reads") > 0 {
        eprintln!(
            "memlend run: {} store reads also served {} other threads' faults read with them",
            sum(reports, "shared_reads"),
            sum(reports, "faults_read_along"),
        );
    }
    if sum(reports, "huge_collapsed") + sum(reports, "huge_failed") > 0 {
        eprintln!(
            "memlend run: huge pages: {} chunks of 2 MiB collapsed while every far page fit ({} failed)",
            sum(reports, "huge_collapsed"),
            sum(reports, "huge_failed"),
        );
    }
    let from_store = sum(reports, "faults_from_store");
    if from_store > 0 {
        let mean_us = |key| sum(reports, key) as f64 / from_store as f64 / 1000.0;
        eprintln!(
            "memlend run: a fault from the store: {:.1} us in its read, {:.1} us mapping it (means)",
            mean_us("fault_store_read_ns"),
            mean_us("fault_map_ns"),
        );
    }
    let peak_rss = reports.iter().filter_map(|r| r["peak_rss_bytes"].as_u64()).max().unwrap_or(0);
    let at_exit = |key| reports.iter().filter_map(|r| r[key].as_u64()).min().unwrap_or(0);
    eprintln!(
        "memlend run: peak resident set {} (the largest process); far budget at exit {} \
         ({} of it kept for memlend's buffers)",
        human(peak_rss),
        human(at_exit("budget_pages") * 4096),
        human(at_exit("reserve_pages") * 4096)
    );
    let cgroup_limit = at_exit("mem_cgroup_limit_bytes");
    if cgroup_limit > 0 {
        eprintln!(
            "memlend run: --mem followed the charge of its memory cgroup, whose limit ({}) binds",
            human(cgroup_limit)
        );
    }
    let batches = sum(reports, "eviction_batches");
    if let Some(per_batch) = sum(reports, "pages_written_back").checked_div(batches) {
        eprintln!(
            "memlend run: eviction: {batches} write-back batches ({per_batch} pages each on \
             average); {} evictions ran on a fault's path (no free page), {} ahead of the faults",
            sum(reports, "evictions_on_fault"),
            sum(reports, "eviction_batches_ahead"),
        );
    }
    let waits = sum(reports, "staging_waits");
    if waits > 0 {
        eprintln!(
            "memlend run: evictions waited for a write-back job {waits} times, {:.1} ms in all",
            sum(reports, "staging_wait_ns") as f64 / 1e6
        );
    }
    print_pool(reports);
    print_latency(reports);
    print_forks(reports);
    if sum(reports, "copy_legs") > 0 {
        eprintln!(
            "memlend run: copies: {} lost and {} rebuilt; {} bad copies repaired from the other; {} pages lost",
            sum(reports, "copy_legs_failed"),
            sum(reports, "copy_rebuilds"),
            sum(reports, "copy_bad"),
            sum(reports, "copy_pages_lost"),
        );
    }
    for r in reports {
        for line in r["layer_reports"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            eprintln!("memlend run: pid {}: {line}", r["pid"]);
        }
    }
}

fn print_pool(reports: &[Value]) {
    let stored = sum(reports, "pool_pages_stored");
    let incompressible = sum(reports, "pool_pages_incompressible");
    let skipped = sum(reports, "pool_pages_skipped");
    if stored + incompressible == 0 {
        return;
    }
    let from_pool = sum(reports, "faults_from_pool");
    let held = sum(reports, "pool_pages_held");
    let ratio = match sum(reports, "pool_bytes_held") {
        0 => String::new(),
        bytes => format!(", {:.1}x compressed", (held * 4096) as f64 / bytes as f64),
    };
    let mean = |key| sum(reports, key) as f64 / from_pool.max(1) as f64 / 1000.0;
    eprintln!(
        "memlend run: compressed pool: {from_pool} faults served ({:.1} us decompressing, {:.1} us mapping, means); {stored} pages kept, {incompressible} did not compress, {skipped} not tried (pool at its smallest); at exit {held} pages in {}{ratio}",
        mean("fault_pool_read_ns"),
        mean("fault_pool_map_ns"),
        human(sum(reports, "pool_charged_pages") * 4096),
    );
}

/// Fault latency percentiles, misses only, from the process with the most
/// faults from the store (a histogram cannot be summed from percentiles).
fn print_latency(reports: &[Value]) {
    let Some(busiest) = reports.iter().max_by_key(|r| r["faults_from_store"].as_u64()) else {
        return;
    };
    let us = |key: &str| busiest[key].as_u64().unwrap_or(0) as f64 / 1000.0;
    let mut parts = Vec::new();
    for (name, prefix) in [("from the store", "fault_store"), ("from the pool", "fault_pool")] {
        if us(&format!("{prefix}_latency_ns_p50")) > 0.0 {
            parts.push(format!(
                "{name} p50 {:.1} / p99 {:.1} / p99.9 {:.1} us",
                us(&format!("{prefix}_latency_ns_p50")),
                us(&format!("{prefix}_latency_ns_p99")),
                us(&format!("{prefix}_latency_ns_p999")),
            ));
        }
    }
    if us("fault_store_read_ns_p99") > 0.0 {
        parts.push(format!(
            "the store's parts' p99: read {:.1}, making room {:.1}, map {:.1} us",
            us("fault_store_read_ns_p99"),
            us("fault_room_ns_p99"),
            us("fault_map_ns_p99"),
        ));
    }
    if !parts.is_empty() {
        eprintln!("memlend run: fault latency (message read to wake): {}", parts.join("; "));
    }
}

/// What forked children cost: pages they read through the parent, pages
/// written out at the fork so that no child shares them, old pages kept
/// for them, children whose old pages could not all be kept.
fn print_forks(reports: &[Value]) {
    let forks = sum(reports, "forks");
    if forks == 0 {
        return;
    }
    eprintln!(
        "memlend run: fork: {forks} forks ({} ms getting ready: {} evicting, {} on the dirty \
         pages), {} children served; they read \
         {} far pages through their parent ({} of them copied from its memory), which wrote {} dirty pages out for the forks ({} \
         of them after the fork), kept at most {} old pages for them and unshared {} pages to \
         evict them ({} a batch at a time, {} one by one)",
        sum(reports, "fork_pause_ms"),
        sum(reports, "fork_pause_evict_ms"),
        sum(reports, "fork_pause_dirty_ms"),
        sum(reports, "fork_children"),
        sum(reports, "fork_pages_sent"),
        sum(reports, "fork_pages_copied"),
        sum(reports, "fork_pages_cleaned"),
        sum(reports, "fork_pages_cleaned_after"),
        sum(reports, "fork_kept_pages_peak"),
        sum(reports, "pages_unshared") + sum(reports, "pages_unshared_ahead"),
        sum(reports, "pages_unshared_ahead"),
        sum(reports, "pages_unshared"),
    );
    let given_up = sum(reports, "fork_snapshots_given_up");
    if given_up > 0 {
        eprintln!(
            "memlend run: fork: {given_up} children could not be given every old page (spill \
             file full or failing, see --fork-spill); their far reads failed"
        );
    }
}
