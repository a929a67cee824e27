//! The processes that borrow through memlend on this machine, from the live
//! files their shims write once a second (`crates/preload/src/live.rs`):
//! read by `memlend top` and by memlendd's metrics.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where shims write: this directory when they may make it (root), else
/// `/tmp/<TMP_PREFIX><uid>`.
pub const RUN_DIR: &str = "/run/memlend-live";
pub const TMP_PREFIX: &str = "memlend-live-";
/// Most processes read per look.
pub const PROCS_MAX: usize = 256;

/// One process, from its live file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proc {
    pub pid: u32,
    pub command: String,
    pub store: String,
    /// The whole process's resident set, and the far region's part of it.
    pub rss_bytes: u64,
    pub resident_far_bytes: u64,
    /// Far memory allocated, and the local budget for it.
    pub far_bytes: u64,
    pub budget_bytes: u64,
    /// Faults per second since the last look (None on the first).
    pub store_faults_per_s: Option<f64>,
    pub pool_faults_per_s: Option<f64>,
    /// Store-fault latency since the process started (fault to wake).
    pub miss_us_p50: f64,
    pub miss_us_p99: f64,
    pub prefetch_hits: u64,
    pub prefetch_wasted: u64,
    /// Compressed pool: pages held and their compression ratio.
    pub pool_pages: u64,
    pub pool_ratio: Option<f64>,
    /// When the shim wrote the file, and its fault counters then.
    pub written_unix_ms: u64,
    pub faults_from_store: u64,
    pub faults_from_pool: u64,
    pub faults_zero_filled: u64,
    pub miss_us_p999: f64,
}

/// Every live process's file, read (at most `PROCS_MAX`), sorted by pid.
/// With `tidy`, the files of processes that are gone are removed.
pub fn read_all(tidy: bool) -> Vec<Proc> {
    let mut out = Vec::new();
    for path in live_files().into_iter().take(PROCS_MAX) {
        let Some(pid) = pid_of(&path) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            if tidy {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let Ok(json) = serde_json::from_str::<Value>(&text) else { continue };
        out.push(from_json(pid, &json));
    }
    out.sort_by_key(|p| p.pid);
    out
}

fn u(json: &Value, key: &str) -> u64 {
    json[key].as_u64().unwrap_or(0)
}

pub fn from_json(pid: u32, j: &Value) -> Proc {
    let held = u(j, "pool_pages_held");
    let bytes_held = u(j, "pool_bytes_held");
    Proc {
        pid,
        command: command_of(pid),
        store: j["store"].as_str().unwrap_or("").to_string(),
        rss_bytes: rss_of(pid),
        resident_far_bytes: u(j, "pages_resident") * 4096,
        far_bytes: u(j, "live_far_bytes"),
        budget_bytes: u(j, "budget_pages") * 4096,
        store_faults_per_s: None,
        pool_faults_per_s: None,
        miss_us_p50: u(j, "fault_store_latency_ns_p50") as f64 / 1000.0,
        miss_us_p99: u(j, "fault_store_latency_ns_p99") as f64 / 1000.0,
        prefetch_hits: u(j, "prefetch_hits"),
        prefetch_wasted: u(j, "prefetch_wasted"),
        pool_pages: held,
        pool_ratio: (bytes_held > 0).then(|| (held * 4096) as f64 / bytes_held as f64),
        written_unix_ms: u(j, "written_unix_ms"),
        faults_from_store: u(j, "faults_from_store"),
        faults_from_pool: u(j, "faults_from_pool"),
        faults_zero_filled: u(j, "faults_zero_filled"),
        miss_us_p999: u(j, "fault_store_latency_ns_p999") as f64 / 1000.0,
    }
}

/// `<dir>/<pid>.json` in the live directories, sorted.
fn live_files() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(RUN_DIR)];
    if let Ok(tmp) = std::fs::read_dir("/tmp") {
        let ours =
            tmp.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(TMP_PREFIX));
        dirs.extend(ours.map(|e| e.path()));
    }
    let mut files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        files.extend(entries.flatten().map(|e| e.path()).filter(|p| pid_of(p).is_some()));
    }
    files.sort();
    files
}

fn pid_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_suffix(".json")?.parse().ok()
}

/// The command line, arguments joined by spaces, control characters as
/// spaces, at most `COMMAND_CHARS_MAX` (the name if unreadable).
fn command_of(pid: u32) -> String {
    const COMMAND_CHARS_MAX: usize = 72;
    let line = command_line(pid).replace(|c: char| c.is_control(), " ");
    match line.char_indices().nth(COMMAND_CHARS_MAX) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line,
    }
}

fn command_line(pid: u32) -> String {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(raw) if !raw.is_empty() => {
            let parts: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            parts.join(" ")
        }
        _ => std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().into(),
    }
}

fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:"));
    let kib = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_file_becomes_a_row() {
        let j: Value = serde_json::from_str(
            r#"{"pid":7,"written_unix_ms":1000,"store":"remote 127.0.0.1:7070","pages_resident":256,
                "live_far_bytes":67108864,"budget_pages":4096,"faults_from_store":10,
                "fault_store_latency_ns_p50":17400,"fault_store_latency_ns_p99":118800,
                "prefetch_hits":3,"prefetch_wasted":1,"pool_pages_held":100,"pool_bytes_held":163840}"#,
        )
        .unwrap();
        let p = from_json(u32::MAX, &j);
        assert_eq!(p.resident_far_bytes, 1 << 20);
        assert_eq!(p.far_bytes, 64 << 20);
        assert_eq!(p.budget_bytes, 16 << 20);
        assert_eq!((p.miss_us_p50, p.miss_us_p99), (17.4, 118.8));
        assert_eq!(p.pool_ratio, Some(2.5));
        assert_eq!(p.store, "remote 127.0.0.1:7070");
    }

    #[test]
    fn only_pid_json_names_are_live_files() {
        assert_eq!(pid_of(Path::new("/run/memlend/live/123.json")), Some(123));
        assert_eq!(pid_of(Path::new("/run/memlend/live/.123.json.new")), None);
        assert_eq!(pid_of(Path::new("/run/memlend/live/x.json")), None);
    }
}
