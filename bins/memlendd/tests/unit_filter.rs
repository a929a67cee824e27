//! The packaged systemd unit (`packaging/memlendd.service`) lets memlendd
//! make every system call it makes while it starts, serves pages and stops.
//!
//! The unit's `SystemCallFilter=` lines are expanded with `systemd-analyze
//! syscall-filter`, in order, as systemd applies them. memlendd runs twice
//! with the shipped config under `strace -f`: once serving (`mlock`, a
//! borrower's writes and reads, the spinning poll and its priority change,
//! qemu-io over an NBD export), once with the cluster control plane, its
//! API socket and a metrics scrape; each stops on SIGTERM.
//! A call outside the filter fails there (or, without
//! `SystemCallErrorNumber=`, kills the daemon with SIGSYS, losing the pages
//! it holds): the first build's filter denied `sched_setaffinity`, which the
//! start-up wake-cost probe makes, so the packaged daemon could not start.

use memlend_remote::{ClientConfig, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use std::collections::BTreeSet;
use std::io::{Read, Write};
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

/// memlendd under `strace -f` with the shipped config plus `extra` keys
/// (its `listen` moved to `addr`).
struct Traced {
    strace: Reaped,
    trace: PathBuf,
}

impl Traced {
    fn start(dir: &Path, name: &str, addr: SocketAddr, extra: &str) -> Traced {
        let shipped = std::fs::read_to_string(repo().join("packaging/memlendd.toml")).unwrap();
        assert!(shipped.contains("\nlisten = \"127.0.0.1:7070\"\n"), "the shipped config changed");
        assert!(shipped.contains("\nlend = \"1G\"\n"), "the shipped config changed");
        // 6 MiB lent, so that `mlock` fits a default RLIMIT_MEMLOCK of 8 MiB
        // where the test lacks CAP_IPC_LOCK (the unit sets it unlimited).
        let text = shipped
            .replace("127.0.0.1:7070", &addr.to_string())
            .replace("\nlend = \"1G\"", "\nlend = \"6M\"")
            + extra;
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, text).unwrap();
        let trace = dir.join(format!("{name}.trace"));
        let child = Command::new("strace")
            .args(["-f", "-qq", "-o"])
            .arg(&trace)
            .arg(BIN)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut strace = Reaped(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !memlend_net::someone_listens(addr) {
            assert!(strace.0.try_wait().unwrap().is_none(), "memlendd ({name}) exited early");
            assert!(Instant::now() < deadline, "memlendd ({name}) did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Traced { strace, trace }
    }

    /// SIGTERM, a clean exit, and the calls it made.
    fn stop(mut self) -> BTreeSet<String> {
        let pid = tracee_of(self.strace.0.id()).expect("strace has no child");
        // SAFETY: a signal to the memlendd this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = self.strace.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "memlendd did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "memlendd under strace ended with {status}");
        calls_in(&std::fs::read_to_string(&self.trace).unwrap())
    }
}

fn free() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Serving: a borrower's writes, then reads with pauses (so the connection
/// both spins and sleeps), and qemu-io over an NBD export, with `mlock`.
fn serving(dir: &Path) -> BTreeSet<String> {
    let (addr, nbd) = (free(), free());
    let extra = format!("mlock = true\nexport = [\"t=1M\"]\nnbd = \"{nbd}\"\n");
    let daemon = Traced::start(dir, "serving", addr, &extra);
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
    daemon.stop()
}

/// The cluster control plane (which lends only through leases), its API
/// socket and a metrics scrape.
fn cluster(dir: &Path) -> BTreeSet<String> {
    let (addr, metrics) = (free(), free());
    let control = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let api = dir.join("memlendd.sock");
    let extra = format!(
        "cluster = true\ncontrol = \"{control}\"\napi = \"{}\"\nmetrics = \"{metrics}\"\n",
        api.display()
    );
    let daemon = Traced::start(dir, "cluster", addr, &extra);
    // Both come up after the page listener, each in its own time.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&api).is_err()
        || !memlend_net::someone_listens(metrics)
    {
        assert!(Instant::now() < deadline, "no API socket at {} or metrics", api.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut http = std::net::TcpStream::connect(metrics).unwrap();
    http.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    http.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.") && page.contains("memlend"), "{page}");
    daemon.stop()
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
    let dir = tempfile::tempdir().unwrap();
    let served = serving(dir.path());
    for must in ["accept4", "recvfrom", "sendto", "sched_setaffinity", "mlock2"] {
        assert!(served.contains(must), "the trace lacks {must}: the run did not serve\n{served:?}");
    }
    let mut used = cluster(dir.path());
    used.extend(served);
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
