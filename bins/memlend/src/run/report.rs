//! The summary `memlend run` prints when the program ends: what far memory
//! did, summed over every process of the run that used it (each leaves
//! `<pid>.json` in the stats directory at exit).

use memlend_node::size::human;
use serde_json::Value;
use std::path::Path;
use std::process::ExitStatus;

/// Most process reports read: a fork bomb must not make us read forever.
const REPORTS_MAX: usize = 4096;

/// What the processes of a run left: exit reports (`<pid>.json`), and the
/// seen files (`<pid>.seen.json`) the shim writes as it goes, which a
/// process killed before its exit leaves too.
pub struct Reports {
    /// One a process that used far memory: its exit report, or, if it left
    /// none, its counters as of its last second (`<pid>.last.json`).
    pub exits: Vec<Value>,
    /// Processes counted from their last second's counters.
    pub from_last: usize,
    /// Seen files of processes with neither (killed in their first second,
    /// or no far heap).
    pub seen_only: Vec<Value>,
}

pub fn collect(dir: &Path) -> Reports {
    let (mut exits, mut lasts, mut seen) = (Vec::new(), Vec::new(), Vec::new());
    let mut all = Reports { exits: Vec::new(), from_last: 0, seen_only: Vec::new() };
    let Ok(entries) = std::fs::read_dir(dir) else { return all };
    for entry in entries.flatten().take(REPORTS_MAX) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // being written
        }
        let Some(v) = std::fs::read_to_string(entry.path())
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        else {
            continue;
        };
        match () {
            _ if name.ends_with(".seen.json") => seen.push(v),
            _ if name.ends_with(".last.json") => lasts.push(v),
            _ => exits.push(v),
        }
    }
    let has = |list: &[Value], pid: &Value| list.iter().any(|r| &r["pid"] == pid);
    lasts.retain(|l| !has(&exits, &l["pid"]));
    seen.retain(|s| !has(&exits, &s["pid"]) && !has(&lasts, &s["pid"]));
    all.from_last = lasts.len();
    exits.extend(lasts);
    all.exits = exits;
    all.seen_only = seen;
    all
}

/// The kinds of memory the shim passed to the kernel, as the reports name
/// them (`crates/preload/src/seen.rs`), and what each is.
const PASSED: [(&str, &str); 4] = [
    ("shared", "shared memory not made far (POSIX shm, memfd, System V shm; shared anonymous memory with --shared off or past the server's limits): kept local"),
    ("reserved_local", "reservations made PROT_NONE to commit later (a JVM heap, Go and V8 arenas) that the far region had no room for (--far): kept local"),
    ("placed", "mappings placed with MAP_FIXED outside far memory: kept local"),
    ("no_room", "private mappings the far heap had no room for (full, or a forked child's): kept local"),
];

/// What the shim saw but did not make far, and processes that left no exit
/// report: said whether or not far memory was used.
fn print_unadopted(all: &[&Value], seen_only: &[Value], from_last: usize) {
    if from_last > 0 {
        eprintln!(
            "memlend run: {from_last} process(es) ended without an exit report (killed, or \
             exited without libc's exit handlers, as Go programs do): their counters are as of \
             their last second"
        );
    }
    let killed = seen_only.iter().filter(|s| s["far_heap"].as_bool() == Some(true)).count();
    if killed > 0 {
        eprintln!(
            "memlend run: {killed} process(es) used far memory but left no report (ended in \
             their first second without running exit handlers: killed, or a Go program); their \
             counters are not in this summary"
        );
    }
    let total = |key: String| all.iter().filter_map(|r| r[&key].as_u64()).sum::<u64>();
    for (kind, what) in PASSED {
        let bytes = total(format!("seen_{kind}_bytes"));
        if bytes > 0 {
            eprintln!(
                "memlend run: passed to the kernel: {} in {} large mappings of {what}",
                human(bytes),
                total(format!("seen_{kind}_maps"))
            );
        }
    }
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
    all: &Reports,
    shared_far: bool,
) {
    let how = match status.code() {
        Some(code) => format!("exited {code}"),
        None => format!("was killed ({status})"),
    };
    eprintln!("memlend run: {} {how} after {elapsed_s:.1} s", cmd.join(" "));
    let every: Vec<&Value> = all.exits.iter().chain(&all.seen_only).collect();
    let reports = &all.exits[..];
    if reports.is_empty() {
        print_unadopted(&every, &all.seen_only, all.from_last);
        let seen_any = every.iter().any(|r| {
            r.as_object().is_some_and(|o| {
                o.iter().any(|(k, v)| k.starts_with("seen_") && v.as_u64().unwrap_or(0) > 0)
            })
        });
        let heap_made = all.seen_only.iter().any(|s| s["far_heap"].as_bool() == Some(true));
        if heap_made || shared_far {
            // Said above (far memory was used by a process that left no
            // report), or below (shared memory was far).
        } else if seen_any {
            eprintln!(
                "memlend run: far memory was not used: every large mapping was of a kind above"
            );
        } else {
            eprintln!(
                "memlend run: no process made a large allocation through the shim (the malloc \
                 family or an anonymous mmap of MEMLEND_THRESHOLD or more); far memory was not used"
            );
        }
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
        "memlend run: made far: {} in {} large allocations (malloc family), {} in {} anonymous \
         private mappings, {} in {} reservations (PROT_NONE, committed later: {} commits in place)",
        human(sum(reports, "seen_malloc_bytes")),
        sum(reports, "seen_malloc_maps"),
        human(sum(reports, "seen_private_bytes")),
        sum(reports, "seen_private_maps"),
        human(sum(reports, "seen_reserved_bytes")),
        sum(reports, "seen_reserved_maps"),
        sum(reports, "seen_committed_maps"),
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
    print_unadopted(&every, &all.seen_only, all.from_last);
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

/// What the shared-memory server did (`shared.rs`), whether or not any
/// process left a report.
pub fn print_shared(s: &super::shared::Summary) {
    if s.segments == 0 && s.refused == 0 {
        return;
    }
    eprintln!(
        "memlend run: made far: {} in {} shared anonymous mapping(s), served across processes: \
         {} pages evicted, {} faults from the store, {} zero-filled, peak {} resident{}{}",
        human(s.bytes),
        s.segments,
        s.evicted_pages,
        s.store_reads,
        s.zero_fills,
        human(s.peak_resident_bytes),
        match s.refused {
            0 => String::new(),
            n => format!("; {n} refused (kept local; the log says why)"),
        },
        match s.brought_home {
            0 => String::new(),
            n =>
                format!("; {n} far pages brought home for processes still mapping them at the end"),
        },
    );
    if s.poisoned > 0 {
        eprintln!(
            "memlend run: {} shared pages could not be read back (SIGBUS to their readers)",
            s.poisoned
        );
    }
}
