//! Shared by the `memlend run` tests: the binaries, a donor daemon, C
//! programs compiled on the spot, and a run's summary parsed.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const MEMLEND: &str = env!("CARGO_BIN_EXE_memlend");

/// A binary built beside `memlend` by `make build` (cargo builds only this
/// package's binaries for its tests).
pub fn sibling(name: &str) -> PathBuf {
    let path = Path::new(MEMLEND).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --release --workspace` first (make test does)",
        path.display()
    );
    path
}

/// The preload shim, checked to be newer than its sources so a test never
/// runs a stale one.
pub fn shim() -> PathBuf {
    let so = sibling("libmemlend_preload.so");
    let built = so.metadata().unwrap().modified().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/preload/src");
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        let changed = entry.metadata().unwrap().modified().unwrap();
        assert!(changed <= built, "{} is older than its sources: rebuild it", so.display());
    }
    so
}

pub struct Donor {
    pub addr: SocketAddr,
    pub child: Child,
}

impl Donor {
    pub fn start(lend: &str) -> Donor {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut child = Command::new(sibling("memlendd"))
            .args(["--lend", lend, "--insecure", "--listen", &addr.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !memlend_net::someone_listens(addr) {
            assert!(child.try_wait().unwrap().is_none(), "memlendd exited early");
            assert!(Instant::now() < deadline, "memlendd did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Donor { addr, child }
    }
}

impl Drop for Donor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process killed when the test ends, even by a failed assertion.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Compile `tests/progs/NAME.c` into `dir`.
pub fn compile(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/progs/{name}.c"));
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc not found: install build-essential (scripts/setup.sh does)");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}

/// `memlend run ARGS -- CMD`, with its output.
pub fn memlend_run(args: &[&str], cmd: &[&str]) -> Output {
    Command::new(MEMLEND)
        .arg("run")
        .arg("--preload")
        .arg(shim())
        .args(args)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap()
}

pub fn plain_run(cmd: &[&str]) -> Output {
    Command::new(cmd[0]).args(&cmd[1..]).output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The largest process's peak resident set, in MiB, from the run's summary.
pub fn peak_rss_mib(stderr: &str) -> f64 {
    let line = stderr.lines().find(|l| l.contains("peak resident set")).unwrap_or_else(|| {
        panic!("no peak resident set in:\n{stderr}");
    });
    let after = line.split("peak resident set ").nth(1).unwrap();
    let mut words = after.split_whitespace();
    let value: f64 = words.next().unwrap().parse().unwrap();
    match words.next().unwrap() {
        "GiB" => value * 1024.0,
        "MiB" => value,
        "KiB" => value / 1024.0,
        unit => panic!("unit {unit} in {line}"),
    }
}

/// The number before `what` in the run's far-memory summary.
fn summary_count(stderr: &str, what: &str) -> u64 {
    let line = stderr.lines().find(|l| l.contains(what)).unwrap_or_else(|| {
        panic!("no far-memory summary in:\n{stderr}");
    });
    let before = line.split(what).next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Pages read back from the store, by faults or by prefetch.
pub fn faults_from_store(stderr: &str) -> u64 {
    summary_count(stderr, " from the store") + summary_count(stderr, " prefetched")
}

/// Assert the run ended well, printed what the plain run printed, and
/// really used far memory.
pub fn assert_same_output_and_far(far: &Output, plain: &Output) {
    let (err, out) = (text(&far.stderr), text(&far.stdout));
    assert!(far.status.success(), "memlend run failed: {}\n{err}", far.status);
    assert!(plain.status.success(), "plain run failed: {}", text(&plain.stderr));
    assert_eq!(out, text(&plain.stdout), "output differs under memlend run\n{err}");
    assert!(faults_from_store(&err) > 0, "far memory was not used:\n{err}");
}
