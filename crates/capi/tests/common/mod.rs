//! What the C and Python tests share: the built library, the memlendd
//! binary, donors to test against, a C compiler.
//!
//! `cargo test` builds this crate's library (cdylib and staticlib) before it
//! runs the tests, but leaves it in target/<profile>/deps/: only `cargo
//! build` copies it up to target/<profile>/libmemlend.so. So the tests take
//! the newer of the two. memlendd is built by `cargo test --workspace`; run
//! alone (`cargo test -p memlend-capi`), these tests build it with cargo.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// target/release or target/debug: the test binary is in its deps/.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>").to_path_buf()
}

fn release() -> bool {
    profile_dir().file_name().is_some_and(|n| n == "release")
}

/// One cargo build at a time from these tests.
static BUILD: Mutex<()> = Mutex::new(());

/// `path`, built with `cargo build -p package` if it is not there.
fn built(path: PathBuf, package: &str) -> PathBuf {
    let _one = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", package]);
        if release() {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build");
        assert!(st.success(), "cargo build -p {package} failed");
    }
    assert!(path.exists(), "{} is missing after cargo build -p {package}", path.display());
    path
}

/// The newest `name` in target/<profile>/deps or target/<profile>.
fn library(name: &str) -> PathBuf {
    let dir = profile_dir();
    let mtime = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    let found = [dir.join("deps").join(name), dir.join(name)]
        .into_iter()
        .filter_map(|p| Some((mtime(&p)?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p);
    found.unwrap_or_else(|| built(dir.join(name), "memlend-capi"))
}

/// The shared library (libmemlend.so).
pub fn libmemlend_so() -> PathBuf {
    library("libmemlend.so")
}

/// The static library (libmemlend.a).
pub fn libmemlend_a() -> PathBuf {
    library("libmemlend.a")
}

pub fn memlendd_bin() -> PathBuf {
    built(profile_dir().join("memlendd"), "memlendd")
}

/// The workspace root (for include/ and python/).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A donor daemon, killed when dropped.
pub struct Donor {
    pub addr: SocketAddr,
    child: Child,
}

impl Donor {
    /// `memlendd --lend SIZE --listen 127.0.0.1:0`, keyless (`--insecure`)
    /// or with `key`. The port is the one memlendd logs ("listen=ADDR"), so
    /// parallel tests never race for a port.
    pub fn start(lend: &str, key: Option<&Path>) -> Donor {
        let mut cmd = Command::new(memlendd_bin());
        cmd.args(["--lend", lend, "--listen", "127.0.0.1:0"]).env("RUST_LOG", "info");
        match key {
            Some(k) => cmd.arg("--key").arg(k),
            None => cmd.arg("--insecure"),
        };
        let mut child =
            cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start memlendd");
        let (tx, rx) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            // Forward the log (drained, so memlendd never blocks on it);
            // the first "listen=" names the address.
            for line in stderr.lines().map_while(Result::ok) {
                let addr = line.split_whitespace().find_map(|w| w.strip_prefix("listen="));
                if let Some(addr) = addr.and_then(|a| a.parse::<SocketAddr>().ok()) {
                    let _ = tx.send(addr);
                }
                eprintln!("memlendd: {line}");
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("memlendd did not log its listen= address within 10 s");
            }
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
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

/// An address nothing listens on: port 1 (tcpmux) on loopback, reserved
/// and unused, so a connection is refused at once.
pub fn dead_addr() -> SocketAddr {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert!(TcpStream::connect(addr).is_err(), "something listens on {addr}");
    addr
}

/// A cluster key file (64 hex digits, mode 0600) in `dir`.
pub fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{}\n", format!("{byte:02x}").repeat(32))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}
