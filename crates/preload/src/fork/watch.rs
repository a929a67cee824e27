//! A fork that does not finish says where it waits.
//!
//! One benchmark cell stalled at a fork with nothing to show where: the
//! forking thread never came back, so nothing it could log would be seen.
//! This thread, started at the first followed fork, looks once a second:
//! a fork not done after `FIRST_LOOK` is logged with every thread of the
//! process, its state, where the kernel has it wait (`wchan`) and, for
//! root, its kernel stack; again every `AGAIN`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Once;
use std::time::{Duration, Instant};

/// A fork not done after this is logged...
const FIRST_LOOK: Duration = Duration::from_secs(10);
/// ...and again each time this much longer.
const AGAIN: Duration = Duration::from_secs(30);
/// How often the thread looks.
const TICK: Duration = Duration::from_secs(1);
/// Threads listed in one log, and bytes of each kernel stack.
const THREADS_MAX: usize = 256;
const STACK_BYTES_MAX: usize = 1024;

/// When the fork under way began, in ms since `EPOCH`; 0 when none is.
static STARTED_MS: AtomicU64 = AtomicU64::new(0);
static START: Once = Once::new();

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    // +1: a fork started at the epoch's first ms is not "none".
    epoch().elapsed().as_millis() as u64 + 1
}

/// A followed fork begins (before the handler is paused).
pub fn fork_begins() {
    START.call_once(|| {
        let spawned = std::thread::Builder::new().name("memlend-forkwatch".into()).spawn(watch);
        if let Err(e) = spawned {
            tracing::warn!("fork: no thread to watch forks for stalls: {e}");
        }
    });
    STARTED_MS.store(now_ms(), Relaxed);
}

/// The fork is over, in the parent.
pub fn fork_done() {
    STARTED_MS.store(0, Relaxed);
}

fn watch() {
    let mut due = Due::default();
    // Runs for the life of the process; each turn is one sleep and a load.
    loop {
        std::thread::sleep(TICK);
        if let Some(waited) = due.look(STARTED_MS.load(Relaxed), now_ms()) {
            tracing::error!(
                "fork: not done after {} s; where each thread waits:\n{}",
                waited.as_secs(),
                threads_report()
            );
        }
    }
}

/// When the next log of a fork under way is due.
#[derive(Default)]
struct Due {
    /// The start of the fork last looked at (0: none yet).
    fork_ms: u64,
    next: Duration,
}

impl Due {
    /// A look at `now_ms` while the fork under way began at `started_ms`
    /// (0: none is): how long it has waited, if a log is due.
    fn look(&mut self, started_ms: u64, now_ms: u64) -> Option<Duration> {
        if started_ms == 0 {
            return None;
        }
        if started_ms != self.fork_ms {
            (self.fork_ms, self.next) = (started_ms, FIRST_LOOK);
        }
        let waited = Duration::from_millis(now_ms.saturating_sub(started_ms));
        if waited < self.next {
            return None;
        }
        self.next += AGAIN;
        Some(waited)
    }
}

/// One line a thread: tid, name, state, wchan | kernel stack.
fn threads_report() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return "(cannot list /proc/self/task)".into();
    };
    let mut lines = Vec::new();
    for task in tasks.flatten().take(THREADS_MAX) {
        let dir = task.path();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        let stat = read("stat");
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').next());
        let mut stack = read("stack").trim().replace('\n', " < ");
        let mut cut = STACK_BYTES_MAX.min(stack.len());
        while !stack.is_char_boundary(cut) {
            cut -= 1; // bounded: 0 is a boundary
        }
        stack.truncate(cut);
        lines.push(format!(
            "  {} {} {} {} | {}",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            state.unwrap_or("?"),
            read("wchan").trim(),
            stack
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_is_logged_at_ten_seconds_then_every_thirty_and_a_new_one_starts_over() {
        let mut due = Due::default();
        let s = 1000; // ms
        assert_eq!(due.look(0, 50 * s), None, "no fork under way");
        assert_eq!(due.look(s, 10 * s), None, "9 s in");
        assert_eq!(due.look(s, 11 * s), Some(Duration::from_secs(10)));
        assert_eq!(due.look(s, 12 * s), None, "logged once");
        assert_eq!(due.look(s, 40 * s), None, "39 s in");
        assert_eq!(due.look(s, 41 * s), Some(Duration::from_secs(40)));
        // A fork done in time is never logged; the next one starts over.
        assert_eq!(due.look(100 * s, 105 * s), None);
        assert_eq!(due.look(100 * s, 110 * s), Some(Duration::from_secs(10)));
    }

    #[test]
    fn the_report_names_this_thread_with_its_state() {
        std::thread::Builder::new()
            .name("watch-me".into())
            .spawn(|| {
                let report = threads_report();
                let line = report.lines().find(|l| l.contains("watch-me")).expect("listed");
                // This thread is running while it reads its own state.
                assert!(line.contains(" watch-me R "), "{line}");
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
