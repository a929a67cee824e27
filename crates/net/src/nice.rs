//! A spinning wait at the lowest priority.
//!
//! A connection thread that polls for the next request holds a core that
//! the machine's other threads may want: on a donor its own programs, and
//! in a benchmark on one host the borrower and its clients. The poll
//! yields between receives, but at its normal priority the scheduler still
//! gives it its fair share. Lowered while it spins, the thread takes only
//! what no one else wants, and it is back at its own priority to serve
//! the request it caught. Measured (ACMS Figure 8, `bench/donor_slowdown.py`:
//! the donor's own work and memlendd on one CPU, a borrower faulting from
//! the other, medians of 5 and of 3 rounds): the donor's work slowed 0.3%
//! and -0.7% with the poll lowered, 3.3% and 3.1% at nice 0, 33-36% with
//! no poll at all; the borrower's random faults ran 48.7 K/s lowered
//! against 51.4 K at nice 0 (and 24.6 K with no poll). On redis over a
//! loopback donor sharing the borrower's two cores it was within the noise
//! (`bench/results/spinnice_1.json`: 30.9 and 32.4 K ops/s against 28.3
//! and 33.2 K); the whole donor at nice 19, serving included, ran 33.9 and
//! 32.7 K against 28.1 and 29.6 K in alternated runs (`nice_*.json`), but
//! a donor's serving must not wait behind its own work.
//!
//! The tail decides it (`donor_slowdown.py` with the borrower's store-fault
//! latency, 3 rounds, 2026-11-28): with the donor's own work busy on the
//! poll's CPU, a borrower faulting as fast as it could saw p99 38.9 us and
//! p99.9 86 us with the poll at nice 19, against p99 3.8 ms with it at nice
//! 0, and 119 us / 2.2 ms with no poll. The likely reason (not traced): at
//! its own priority a polling thread is never woken, so it never preempts,
//! and waits its turn behind the donor's work for a whole slice; lowered,
//! its spin budget runs out while it is preempted, it sleeps at its own
//! priority, and the next request wakes it, which preempts. So `memlendd`
//! polls at nice 19 by default.
//!
//! Going back up needs the right to raise a thread's priority
//! (CAP_SYS_NICE, which root lacks under a unit's capability bounding set,
//! or RLIMIT_NICE); without it a thread once lowered would stay low for
//! good, so the wait is not lowered at all there.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The lowest priority: the nice value measured above.
pub const SPIN_NICE: i32 = 19;

/// Said once per process: spins are not lowered.
static TOLD: AtomicBool = AtomicBool::new(false);

/// One thread's spinning waits, run at `nice` and then back at the
/// thread's own priority.
#[derive(Debug)]
pub struct SpinNice {
    /// The nice value to spin at; `None`: do not change it.
    nice: Option<i32>,
    /// The thread's own nice value, read on first use.
    own: Option<i32>,
}

impl SpinNice {
    /// Spin at `nice` (clamped to -20..=19); 0 leaves the priority alone.
    pub fn new(nice: i32) -> SpinNice {
        let nice = nice.clamp(-20, 19);
        SpinNice { nice: (nice != 0).then_some(nice), own: None }
    }

    /// Run `wait` (a spinning receive) at the spin's priority, then return
    /// to the thread's own. Must be called on the thread that waits.
    pub fn lowered<R>(&mut self, wait: impl FnOnce() -> R) -> R {
        let Some(nice) = self.nice else { return wait() };
        let own = match self.own {
            Some(own) => own,
            None => match own_nice_if_restorable() {
                Some(own) => *self.own.insert(own),
                None => {
                    self.nice = None;
                    return wait();
                }
            },
        };
        if nice <= own {
            return wait();
        }
        let lowered = set_nice(nice).is_ok();
        let out = wait();
        if lowered {
            if let Err(e) = set_nice(own) {
                // Checked restorable at first use; if it changed, stop.
                self.nice = None;
                tell_once(&format!("cannot return a spinning thread to nice {own}: {e}"));
            }
        }
        out
    }
}

/// This thread's nice value, if it may be set back to it once lowered.
fn own_nice_if_restorable() -> Option<i32> {
    // SAFETY: clearing errno (this thread's own) before getpriority, whose
    // -1 is also a valid nice value.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: plain system call on this thread's id.
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, thread_id()) };
    if own == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
        tell_once("cannot read a connection thread's priority; spins are not lowered");
        return None;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into `limit`, which we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut limit) };
    // RLIMIT_NICE n allows nice values down to 20 - n.
    let allowed = rc == 0 && (20 - limit.rlim_cur.min(40) as i32) <= own;
    if allowed || has_cap_sys_nice() {
        return Some(own);
    }
    tell_once("spins are not lowered: going back up needs CAP_SYS_NICE or RLIMIT_NICE");
    None
}

/// CAP_SYS_NICE (capability 23) is in this thread's effective set. Not
/// "euid is 0": root under a unit's CapabilityBoundingSet may lack it.
fn has_cap_sys_nice() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    cap_eff(&status).is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
}

/// The `CapEff:` mask of a `/proc/.../status` text.
fn cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

fn set_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: plain system call on this thread's id.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, thread_id(), nice) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn thread_id() -> libc::id_t {
    // SAFETY: gettid has no failure mode.
    unsafe { libc::gettid() as libc::id_t }
}

fn tell_once(what: &str) {
    if !TOLD.swap(true, Relaxed) {
        eprintln!("memlend: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_capabilities_are_read_from_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000800000\n";
        assert_eq!(cap_eff(status), Some(1 << 23));
        assert_eq!(cap_eff("Name:\tx\n"), None);
        assert_eq!(cap_eff("CapEff:\tzz\n"), None);
    }

    #[test]
    fn the_wait_runs_lowered_and_the_thread_comes_back() {
        std::thread::spawn(|| {
            let own = own_nice_if_restorable();
            let mut spin = SpinNice::new(SPIN_NICE);
            // SAFETY: as in `own_nice_if_restorable`.
            let during =
                spin.lowered(|| unsafe { libc::getpriority(libc::PRIO_PROCESS, thread_id()) });
            // SAFETY: as above.
            let after = unsafe { libc::getpriority(libc::PRIO_PROCESS, thread_id()) };
            match own {
                Some(own) => {
                    assert_eq!(during, SPIN_NICE, "lowered while waiting");
                    assert_eq!(after, own, "back at its own priority");
                }
                None => assert_eq!(during, after, "left alone where it could not come back"),
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn zero_leaves_the_priority_alone() {
        let mut spin = SpinNice::new(0);
        // SAFETY: as in `own_nice_if_restorable`.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, thread_id()) };
        // SAFETY: as above.
        let during = spin.lowered(|| unsafe { libc::getpriority(libc::PRIO_PROCESS, thread_id()) });
        assert_eq!(before, during);
    }
}
