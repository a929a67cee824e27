//! Whether spinning pays here: what it costs to wake a thread asleep on
//! another core, measured once per process.
//!
//! A thread that polls for its next request instead of sleeping saves the
//! wake-up, and takes a core's time from every other thread meanwhile. On
//! this project's VMs with the guest's halt polling off
//! (`/sys/module/haltpoll/parameters/guest_halt_poll_ns` = 0), an idle vCPU
//! halts at once and a wake costs ~15 µs more than a spinning wait: a loopback donor that did not spin
//! ran redis at 0.57x of one that did (`bench/results/hp_A0.json`). With the
//! kernel's default halt polling (200 µs) the guest polls for us, a wake
//! costs 2-3 µs, and the same spin cost redis 20% (`hp_B200.json`). So
//! `auto` spins only where a wake is dear.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A wake dearer than this is worth a spin to avoid. Measured on this VM
/// (`examples/wake_cost.rs`): 2.3 µs with halt polling, 15 µs without;
/// this is about their geometric mean.
pub const WAKE_DEAR: Duration = Duration::from_micros(6);
/// Round trips timed each way; their median is kept.
const ROUND_TRIPS: usize = 64;
/// Idle time before each request, as between a borrower's faults (redis at
/// a quarter local sends one every ~57 µs).
const GAP: Duration = Duration::from_micros(50);
/// Bound on any one wait of the measurement (a starved thread gives up).
const WAIT_MAX: Duration = Duration::from_millis(500);

/// What waking a thread asleep on another idle core costs, over what a
/// spinning thread takes to notice the same message; `None` where it
/// cannot be measured (one CPU allowed, or a wait past `WAIT_MAX`).
pub fn wake_cost() -> Option<Duration> {
    static COST: OnceLock<Option<Duration>> = OnceLock::new();
    *COST.get_or_init(|| {
        let cpus = allowed_cpus();
        if cpus.len() < 2 {
            return None;
        }
        let block = round_trip_median(cpus[0], cpus[1], Wait::Block)?;
        let spin = round_trip_median(cpus[0], cpus[1], Wait::Spin)?;
        // Two wakes a round trip: the request's and the reply's.
        Some(block.saturating_sub(spin) / 2)
    })
}

/// Spin where a wake is dear, or where its cost is unknown (as before
/// `auto` existed).
pub fn spin_pays() -> bool {
    wake_cost().is_none_or(|cost| cost >= WAKE_DEAR)
}

/// A spin setting: `auto` (spin `auto_us` where `spin_pays`, else not at
/// all) or a fixed number of microseconds, at most `SPIN_US_MAX`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpinSetting {
    #[default]
    Auto,
    Us(u64),
}

/// A longer spin burns a core for nothing.
pub const SPIN_US_MAX: u64 = 10_000;

impl SpinSetting {
    /// The spin to use, `auto_us` standing for `Auto` where spinning pays.
    pub fn resolve(self, auto_us: u64) -> Duration {
        match self {
            SpinSetting::Us(us) => Duration::from_micros(us),
            SpinSetting::Auto if spin_pays() => Duration::from_micros(auto_us),
            SpinSetting::Auto => Duration::ZERO,
        }
    }
}

impl std::str::FromStr for SpinSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(SpinSetting::Auto);
        }
        match s.parse::<u64>() {
            Ok(us) if us <= SPIN_US_MAX => Ok(SpinSetting::Us(us)),
            _ => Err(format!("`{s}`: expected `auto` or microseconds from 0 to {SPIN_US_MAX}")),
        }
    }
}

impl std::fmt::Display for SpinSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpinSetting::Auto => f.write_str("auto"),
            SpinSetting::Us(us) => write!(f, "{us}"),
        }
    }
}

#[derive(Clone, Copy)]
enum Wait {
    Block,
    Spin,
}

/// The median of `ROUND_TRIPS` request-reply round trips between a thread
/// on `cpu_a` and one on `cpu_b`, each waiting the `how` way.
fn round_trip_median(cpu_a: usize, cpu_b: usize, how: Wait) -> Option<Duration> {
    let (to_b, at_b) = sync_channel::<u32>(1);
    let (to_a, at_a) = sync_channel::<u32>(1);
    let echo = std::thread::Builder::new()
        .name("wake-probe".into())
        .spawn(move || {
            pin_to(cpu_b);
            while let Some(n) = wait(&at_b, how) {
                if to_a.send(n).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    let asker = std::thread::Builder::new()
        .name("wake-probe".into())
        .spawn(move || {
            pin_to(cpu_a);
            let times = ask(&to_b, &at_a, how);
            drop(to_b);
            times
        })
        .ok()?;
    let times = asker.join().ok()?;
    let _ = echo.join();
    let mut times = times?;
    times.sort_unstable();
    Some(times[times.len() / 2])
}

/// Send each request after `GAP` of busy time, and time its reply.
fn ask(to_b: &SyncSender<u32>, at_a: &Receiver<u32>, how: Wait) -> Option<Vec<Duration>> {
    let mut times = Vec::with_capacity(ROUND_TRIPS);
    for n in 0..ROUND_TRIPS as u32 {
        let idle_until = Instant::now() + GAP;
        // Bounded by GAP: the other thread goes idle meanwhile.
        while Instant::now() < idle_until {
            std::hint::spin_loop();
        }
        let sent = Instant::now();
        to_b.send(n).ok()?;
        if wait(at_a, how)? != n {
            return None;
        }
        times.push(sent.elapsed());
    }
    Some(times)
}

/// The next message, waited for `how`, or `None` once the sender is gone
/// or `WAIT_MAX` passed.
fn wait(rx: &Receiver<u32>, how: Wait) -> Option<u32> {
    match how {
        Wait::Block => rx.recv_timeout(WAIT_MAX).ok(),
        Wait::Spin => {
            let give_up = Instant::now() + WAIT_MAX;
            // Bounded by WAIT_MAX.
            loop {
                match rx.try_recv() {
                    Ok(n) => return Some(n),
                    Err(TryRecvError::Disconnected) => return None,
                    Err(TryRecvError::Empty) if Instant::now() > give_up => return None,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
        }
    }
}

/// The CPUs this process may run on, lowest first.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed; 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` is initialised and `cpu` is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Keep the calling thread (a probe's own, which ends with the probe) on
/// `cpu`. A refusal leaves it where the scheduler puts it.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (it came from `allowed_cpus`); the
    // set is passed with its size and only read; 0 is this thread.
    unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_print_back() {
        assert_eq!("auto".parse(), Ok(SpinSetting::Auto));
        assert_eq!("0".parse(), Ok(SpinSetting::Us(0)));
        assert_eq!("10000".parse(), Ok(SpinSetting::Us(10_000)));
        for bad in ["10001", "-1", "", "fast", "50us"] {
            let e = bad.parse::<SpinSetting>().unwrap_err();
            assert!(e.contains("auto"), "{bad}: {e}");
        }
        assert_eq!(SpinSetting::Us(50).to_string(), "50");
        assert_eq!(SpinSetting::Auto.to_string(), "auto");
    }

    #[test]
    fn a_fixed_setting_is_kept_and_auto_follows_the_measurement() {
        assert_eq!(SpinSetting::Us(0).resolve(200), Duration::ZERO);
        assert_eq!(SpinSetting::Us(70).resolve(200), Duration::from_micros(70));
        let auto = SpinSetting::Auto.resolve(200);
        let want = if spin_pays() { Duration::from_micros(200) } else { Duration::ZERO };
        assert_eq!(auto, want);
    }

    #[test]
    fn the_wake_cost_is_measured_where_two_cpus_are_allowed() {
        let cost = wake_cost();
        if allowed_cpus().len() >= 2 {
            let cost = cost.expect("two CPUs allowed, so measured");
            // A wake that took longer than a whole wait bound would have
            // ended the measurement instead.
            assert!(cost < WAIT_MAX, "{cost:?}");
        } else {
            assert_eq!(cost, None);
        }
        assert_eq!(wake_cost(), cost, "measured once");
    }
}
