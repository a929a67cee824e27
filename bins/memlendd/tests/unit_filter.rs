//! The packaged systemd unit (`packaging/memlendd.service`) lets memlendd
//! make every system call it makes while it starts, serves pages and stops.
//!
//! The unit's `SystemCallFilter=` lines are expanded with `systemd-analyze
//! syscall-filter`, in order, as systemd applies them; memlendd runs with the
//! shipped config (plus `mlock` and an NBD export) under `strace -f`,
//! serves a borrower's writes and reads (the spinning poll and its priority
//! change included) and qemu-io's over NBD, and stops on SIGTERM. A call outside the filter fails there (or, without
//! `SystemCallErrorNumber=`, kills the daemon with SIGSYS, losing the pages
//! it holds): the first build's filter denied `sched_setaffinity`, which the
//! start-up wake-cost probe makes, so the packaged daemon could not start.

use memlend_remote::{ClientConfig, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_memlendd");
/// Nested `@group`s in systemd's lists are few levels deep; a bound all the same.
const GROUP_DEPTH_MAX: usize = 8;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn has(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The system calls `item` names: itself, or a `@group`'s members.
fn expand(item: &str, depth: usize) -> BTreeSet<String> {
    let Some(_) = item.strip_prefix('@') else { return BTreeSet::from([item.to_string()]) };
    assert!(depth < GROUP_DEPTH_MAX, "syscall groups nest deeper than {GROUP_DEPTH_MAX} at {item}");
    let out = Command::new("systemd-analyze").args(["syscall-filter", item]).output().unwrap();
    assert!(out.status.success(), "systemd-analyze does not know {item}");
    let text = String::from_utf8(out.stdout).unwrap();
    let members =
        text.lines().skip(1).map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
    members.flat_map(|m| expand(m, depth + 1)).collect()
}

/// What the unit allows: its filter lines applied in order (an allow list,
/// since the first one is; `~` lines take away, later lines add back).
fn allowed_by(unit: &str) -> BTreeSet<String> {
    let mut allowed = BTreeSet::new();
    let lines: Vec<&str> =
        unit.lines().filter_map(|l| l.strip_prefix("SystemCallFilter=")).collect();
    assert!(!lines.is_empty(), "the unit has no SystemCallFilter");
    assert!(!lines[0].starts_with('~'), "the unit's filter is not an allow list");
    for line in lines {
        let (deny, items) = line.strip_prefix('~').map_or((false, line), |rest| (true, rest));
        for set in items.split_whitespace().map(|i| expand(i, 0)) {
            match deny {
                true => allowed.retain(|c| !set.contains(c)),
                false => allowed.extend(set),
            }
        }
    }
    allowed
}

/// The calls strace saw (`PID name(args...`).
fn calls_in(trace: &str) -> BTreeSet<String> {
    let name = |l: &str| {
        let rest = l.split_once(' ')?.1.trim_start();
        let name = &rest[..rest.find('(')?];
        name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_').then(|| name.to_string())
    };
    trace.lines().filter_map(name).collect()
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pid of strace's one child (memlendd).
fn tracee_of(strace: u32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{strace}/task/{strace}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn the_packaged_units_syscall_filter_allows_every_call_memlendd_makes() {
    for tool in ["strace", "systemd-analyze", "qemu-io"] {
        if !has(tool) {
            return memlend_testskip::skip(&format!("{tool} is not installed"));
        }
    }
    let unit = std::fs::read_to_string(repo().join("packaging/memlendd.service")).unwrap();
    let allowed = allowed_by(&unit);
    assert!(allowed.contains("read") && !allowed.contains("reboot"), "the expansion went wrong");

    // The shipped config, on a free port, with what a user turns on next:
    // locked memory and an NBD export. 6 MiB lent, so that `mlock` fits a
    // default RLIMIT_MEMLOCK of 8 MiB where the test lacks CAP_IPC_LOCK
    // (the unit sets LimitMEMLOCK=infinity).
    let dir = tempfile::tempdir().unwrap();
    let free = || -> SocketAddr { TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap() };
    let (addr, nbd) = (free(), free());
    let shipped = std::fs::read_to_string(repo().join("packaging/memlendd.toml")).unwrap();
    assert!(shipped.contains("listen = \"127.0.0.1:7070\""), "the shipped config changed");
    let config = dir.path().join("memlendd.toml");
    assert!(shipped.contains("\nlend = \"1G\"\n"), "the shipped config changed");
    let text = shipped
        .replace("127.0.0.1:7070", &addr.to_string())
        .replace("\nlend = \"1G\"", "\nlend = \"6M\"")
        + &format!("mlock = true\nexport = [\"t=1M\"]\nnbd = \"{nbd}\"\n");
    std::fs::write(&config, text).unwrap();
    let trace = dir.path().join("trace");
    let strace = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&trace)
        .arg(BIN)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut strace = Reaped(strace);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !memlend_net::someone_listens(addr) {
        assert!(strace.0.try_wait().unwrap().is_none(), "memlendd under strace exited early");
        assert!(Instant::now() < deadline, "memlendd did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A borrower: writes, then reads with pauses, so the connection both
    // spins and sleeps between requests.
    let store = RemoteStore::open(addr, ClientConfig::new(None), 1024).unwrap();
    let data: Vec<u8> = (0..64 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    store.write(&[WriteOp { page: 100, data: &data }]).unwrap();
    for pause_us in [0, 50, 500, 5000] {
        let mut back = vec![0u8; data.len()];
        store.read(&mut [ReadOp { page: 100, buf: &mut back }]).unwrap();
        assert!(back == data, "pages read back differ");
        std::thread::sleep(Duration::from_micros(pause_us));
    }
    drop(store);
    let uri = format!("nbd://{nbd}/t");
    let io = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0xa5 0 1M", "-c", "read -P 0xa5 0 1M", &uri])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&io.stdout);
    assert!(io.status.success() && !out.contains("Pattern verification failed"), "{out}");

    let pid = tracee_of(strace.0.id()).expect("strace has no child");
    // SAFETY: a signal to the memlendd this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = strace.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "memlendd did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "memlendd under strace ended with {status}");

    let text = std::fs::read_to_string(&trace).unwrap();
    let used = calls_in(&text);
    for must in ["accept4", "recvfrom", "sendto", "sched_setaffinity", "mlock2"] {
        assert!(used.contains(must), "the trace lacks {must}: the run did not serve\n{used:?}");
    }
    let denied: Vec<&String> = used.iter().filter(|c| !allowed.contains(*c)).collect();
    assert!(denied.is_empty(), "memlendd makes calls the unit's filter denies: {denied:?}");
}

#[test]
fn filter_lines_apply_in_order() {
    if !has("systemd-analyze") {
        return memlend_testskip::skip("systemd-analyze is not installed");
    }
    let unit = "SystemCallFilter=@system-service\nSystemCallFilter=~@resources\nSystemCallFilter=setpriority\n";
    let allowed = allowed_by(unit);
    assert!(allowed.contains("setpriority"), "added back after the deny");
    assert!(!allowed.contains("sched_setaffinity"), "denied with @resources");
    assert!(allowed.contains("read"));
}

#[test]
fn strace_lines_name_their_calls() {
    let trace = "12 read(3, \"x\", 1) = 1\n13 +++ exited with 0 +++\n12 --- SIGTERM {si_signo=SIGTERM} ---\n\
                 14 sched_setaffinity(0, 128, [1]) = 0\n15 <... futex resumed>) = 0\n";
    let calls = calls_in(trace);
    assert_eq!(calls, BTreeSet::from(["read".to_string(), "sched_setaffinity".to_string()]));
}
