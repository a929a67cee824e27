//! Core placement: the handler runs on the core of the thread that faults.
//!
//! A fault is two hand-offs (faulter to handler, handler back). On these
//! 2-vCPU machines a hand-off to the other vCPU, when it is idle, costs tens
//! of µs (the host must wake it), against a few µs on the same one: far
//! more than the rest of a remote fault. Measured (1 GiB, 257 MiB local,
//! loopback donor): uniform touches went from 25-49 K/s, depending on where
//! the scheduler put the threads, to 64-66 K/s with the program and the
//! handler on one core; zipf from 143-186 K to 274-281 K.
//!
//! The faulter's core is not in the fault message, but its thread id is
//! (`UFFD_FEATURE_THREAD_ID`), and `/proc` says where that thread last ran.
//! Reading it costs a few µs, so it is done at most once per
//! `FOLLOW_INTERVAL`; the handler then pins itself to that core. Threads
//! mostly stay put for many milliseconds, and the handler needs the core
//! only while the faulter waits on it. The fetch and write-back threads are
//! left free: they work while the program runs.

use std::io::{self, Read};
use std::time::{Duration, Instant};

/// Look up the faulter's core at most this often.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(2);

/// Where the handler runs, following the threads that fault.
pub(crate) struct Follow {
    enabled: bool,
    /// The cores the handler may use (its affinity when it started).
    allowed: Vec<usize>,
    pinned: Option<usize>,
    last_look: Option<Instant>,
}

impl Follow {
    /// Called on the handler thread. Off when only one core is allowed.
    pub(crate) fn new(enabled: bool) -> Follow {
        let allowed = allowed().unwrap_or_default();
        let enabled = enabled && allowed.len() > 1;
        Follow { enabled, allowed, pinned: None, last_look: None }
    }

    /// A fault from thread `tid` (0: unknown); whether the handler moved.
    pub(crate) fn fault(&mut self, tid: u32) -> bool {
        let recent = self.last_look.is_some_and(|t| t.elapsed() < FOLLOW_INTERVAL);
        if !self.enabled || tid == 0 || recent {
            return false;
        }
        self.last_look = Some(Instant::now());
        let Some(cpu) = cpu_of_thread(tid) else { return false };
        if self.pinned == Some(cpu) || !self.allowed.contains(&cpu) {
            return false;
        }
        if let Err(e) = pin_current(&[cpu]) {
            tracing::warn!("fault handler: cannot move to core {cpu} ({e}); placement off");
            self.enabled = false;
            return false;
        }
        self.pinned = Some(cpu);
        true
    }
}

/// The core thread `tid` of this process last ran on: field 39 of its
/// `/proc` stat line (fields counted after the parenthesised name, which may
/// hold spaces).
fn cpu_of_thread(tid: u32) -> Option<usize> {
    let mut buf = [0u8; 1024];
    let mut file = std::fs::File::open(format!("/proc/self/task/{tid}/stat")).ok()?;
    let len = file.read(&mut buf).ok()?;
    parse_stat_cpu(std::str::from_utf8(&buf[..len]).ok()?)
}

fn parse_stat_cpu(stat: &str) -> Option<usize> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name; field 39 is 36 on.
    after_name.split_ascii_whitespace().nth(36)?.parse().ok()
}

/// The cores the calling thread may run on.
fn allowed() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed; pid 0 is
    // the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let cores = 0..libc::CPU_SETSIZE as usize;
    // SAFETY: CPU_ISSET reads inside the set for any core below CPU_SETSIZE.
    Ok(cores.filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Let the calling thread run only on `cpus`.
fn pin_current(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE (filtered), so the write is in bounds.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_is_field_39_even_when_the_name_has_spaces_and_parens() {
        let rest: Vec<String> =
            (3..=52).map(|f| if f == 39 { "7".into() } else { f.to_string() }).collect();
        let line = format!("4242 (a (b) c) {}\n", rest.join(" "));
        assert_eq!(parse_stat_cpu(&line), Some(7));
        assert_eq!(parse_stat_cpu("4242 (x) S 1 2"), None, "a short line");
    }

    #[test]
    fn this_thread_is_found_where_it_runs() {
        // SAFETY: gettid takes no arguments.
        let tid = unsafe { libc::gettid() } as u32;
        let cpu = cpu_of_thread(tid).expect("our own stat line");
        assert!(allowed().unwrap().contains(&cpu), "core {cpu}");
    }
}
