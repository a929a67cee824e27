//! The daemon as users run it: refusals with clear messages, serving, and a
//! clean stop on SIGTERM.

use memlend_remote::{ClientConfig, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_memlendd");

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A daemon that is killed when the test ends, even by a failed assertion:
/// a test must not leave a memlendd behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Until `child` itself listens at `addr`. Another process may hold a
/// port `free_addr` gave out (it is free only when picked): a SIGTERM sent
/// when that one answered reached a memlendd that had not yet set its
/// handler, and it died of the signal (CI, 2026-11-28).
fn wait_listening(addr: SocketAddr, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(answers(addr) && listens_itself(child.id(), addr.port())) {
        assert!(child.try_wait().unwrap().is_none(), "memlendd exited early");
        assert!(Instant::now() < deadline, "memlendd did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Someone listens at `addr` (not a connection that met itself: see
/// `memlend_net::someone_listens`).
fn answers(addr: SocketAddr) -> bool {
    memlend_net::someone_listens(addr)
}

/// Whether process `pid` holds a socket listening on TCP `port`: the
/// inode of a LISTEN entry for the port in /proc/net/tcp{,6} is one of
/// its descriptors.
fn listens_itself(pid: u32, port: u16) -> bool {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1).and_then(|a| a.rsplit(':').next());
            let listening = f.get(3) == Some(&"0A");
            if listening && local_port == Some(format!("{port:04X}").as_str()) {
                inodes.extend(f.get(9).map(|i| format!("socket:[{i}]")));
            }
        }
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

fn wait_api(path: &std::path::Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "memlendd exited early");
        assert!(Instant::now() < deadline, "the API socket {} did not answer", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM, then wait at most 10 s for the exit.
fn stop_by_sigterm(child: &mut Child) -> std::process::ExitStatus {
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "memlendd did not stop within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn refusal(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(!out.status.success(), "memlendd {args:?} should refuse");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn refuses_to_lend_more_than_the_node_has() {
    let err = refusal(&["--lend", "64T", "--insecure", "--listen", "127.0.0.1:0"]);
    assert!(err.contains("can lend at most"), "{err}");
}

#[test]
fn refuses_to_run_without_a_key_unless_insecure() {
    let err = refusal(&["--lend", "16M", "--listen", "127.0.0.1:0"]);
    assert!(err.contains("--key") && err.contains("--insecure"), "{err}");
}

#[test]
fn refuses_a_key_file_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    std::fs::write(&key, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err =
        refusal(&["--lend", "16M", "--listen", "127.0.0.1:0", "--key", key.to_str().unwrap()]);
    assert!(err.contains("owner only"), "{err}");
}

#[test]
fn refuses_exports_larger_than_the_lend() {
    let err =
        refusal(&["--lend", "16M", "--insecure", "--nbd", "127.0.0.1:0", "--export", "a=32M"]);
    assert!(err.contains("exports need"), "{err}");
}

#[test]
fn refuses_nbd_off_loopback_without_an_allowlist() {
    let err = refusal(&["--lend", "16M", "--insecure", "--nbd", "0.0.0.0:0"]);
    assert!(err.contains("--nbd-allow"), "{err}");
    let err = refusal(&[
        "--lend",
        "16M",
        "--insecure",
        "--nbd",
        "0.0.0.0:0",
        "--nbd-allow",
        "10.0.0.0/33",
    ]);
    assert!(err.contains("bad prefix length"), "{err}");
}

#[test]
fn refuses_unreadable_nbd_tls_files_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, "not a certificate\n").unwrap();
    std::fs::write(&key, "not a key\n").unwrap();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let nbd = ["--lend", "16M", "--insecure", "--nbd", "127.0.0.1:0"];
    let err = refusal(&[&nbd[..], &["--nbd-tls-cert", cert, "--nbd-tls-key", key]].concat());
    assert!(err.contains("cert.pem"), "{err}");
    let err = refusal(&[&nbd[..], &["--nbd-tls-cert", cert]].concat());
    assert!(err.contains("--nbd-tls-key"), "a certificate without its key: {err}");
}

#[test]
fn serves_pages_and_stops_cleanly_on_sigterm() {
    let addr = free_addr();
    let mut reaped = Reaped(
        Command::new(BIN)
            .args(["--lend", "64M", "--insecure", "--listen", &addr.to_string()])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut reaped.0;
    wait_listening(addr, child);
    {
        let s = RemoteStore::open(addr, ClientConfig::new(None), 1024).unwrap();
        let data: Vec<u8> = (0..64 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        s.write(&[WriteOp { page: 100, data: &data }]).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read(&mut [ReadOp { page: 100, buf: &mut back }]).unwrap();
        assert!(back == data);
        let too_big = RemoteStore::open(addr, ClientConfig::new(None), 64 << 8);
        assert!(too_big.is_err(), "a slab beyond --lend is refused");
    }
    let status = stop_by_sigterm(child);
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(status.success(), "exit status {status:?}, log:\n{log}");
    assert!(log.contains("INSECURE"), "insecure mode is said in the log:\n{log}");
    assert!(log.contains("pages_written=64"), "final stats are logged:\n{log}");
    assert!(
        log.contains("page connections spin where a wake across cores is dear"),
        "the default `--spin-us auto` logs what it measured and chose:\n{log}"
    );
}

/// A cluster node's API and metrics accept loops see the stop too: they sat
/// in a blocking accept, so the daemon never exited on SIGTERM.
#[test]
fn a_cluster_node_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("api.sock");
    let (listen, control, metrics) = (free_addr(), free_addr(), free_addr());
    let mut reaped = Reaped(
        Command::new(BIN)
            .args(["--cluster", "--lend", "64M", "--insecure", "--memory", "host"])
            .args(["--listen", &listen.to_string(), "--control", &control.to_string()])
            .args(["--metrics", &metrics.to_string(), "--api", api.to_str().unwrap()])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut reaped.0;
    wait_listening(metrics, child);
    // One port answering says nothing of the others (the metrics port came
    // from free_addr and may even be another test's): wait for each.
    wait_api(&api, child);
    let status = stop_by_sigterm(child);
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(status.success(), "exit status {status:?}, log:\n{log}");
    assert!(!api.exists(), "the API socket is removed on a clean stop");
}

/// A SIGTERM that comes as soon as the first port answers, while the rest
/// of the node is still starting, is a clean stop too: the handler is set
/// before anything binds. (It was set last, and CI once caught the gap.)
#[test]
fn a_sigterm_during_start_is_a_clean_stop() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let api = dir.path().join("api.sock");
        let (listen, control) = (free_addr(), free_addr());
        let mut reaped = Reaped(
            Command::new(BIN)
                .args(["--cluster", "--lend", "64M", "--insecure", "--memory", "host"])
                .args(["--listen", &listen.to_string(), "--control", &control.to_string()])
                .args(["--api", api.to_str().unwrap()])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let child = &mut reaped.0;
        wait_listening(listen, child);
        let status = stop_by_sigterm(child);
        let mut log = String::new();
        child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
        assert!(status.success(), "round {round}: exit status {status:?}, log:\n{log}");
    }
}

/// Far memory end to end: a region four times its local budget whose pages
/// live on a real memlendd; every byte written comes back.
#[test]
fn far_memory_region_over_the_real_daemon() {
    use memlend_fault::{Region, RegionConfig};
    let addr = free_addr();
    let mut reaped = Reaped(
        Command::new(BIN)
            .args(["--lend", "64M", "--insecure", "--listen", &addr.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening(addr, &mut reaped.0);
    let pages = 4096u64;
    let store = RemoteStore::open(addr, ClientConfig::new(None), pages).unwrap();
    let cfg = RegionConfig {
        size_bytes: pages as usize * PAGE_SIZE,
        budget_pages: 1024,
        ..RegionConfig::default()
    };
    let region = Region::new(cfg, std::sync::Arc::new(store)).unwrap();
    // SAFETY: the region maps `len()` bytes while `region` lives and only
    // this thread touches it.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    let word = |page: usize, i: usize| (page as u64) << 32 | i as u64 ^ 0x5a5a;
    for (page, chunk) in mem.chunks_exact_mut(PAGE_SIZE).enumerate() {
        for (i, w) in chunk.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(page, i).to_le_bytes());
        }
    }
    for (page, chunk) in mem.chunks_exact(PAGE_SIZE).enumerate().rev() {
        for (i, w) in chunk.chunks_exact(8).enumerate() {
            assert_eq!(u64::from_le_bytes(w.try_into().unwrap()), word(page, i), "page {page}");
        }
    }
    let st = region.stats();
    assert!(st.pages_resident <= 1024, "{st:?}");
    // Read back in reverse, so prefetch may fetch some along the trend.
    let fetched = st.faults_from_store + region.handler_stats().pages_prefetched;
    assert!(fetched >= 3000, "most pages came back from the donor: {st:?}");
    drop(region);
}

/// `--config`: the file's settings are used, a flag overrides one, and a
/// slab larger than the file's per-borrower cap is refused; `--check-config`
/// accepts the same file and refuses a bad one naming its line.
#[test]
fn serves_from_a_config_file_with_flags_overriding_it() {
    let dir = tempfile::tempdir().unwrap();
    let (file_addr, addr) = (free_addr(), free_addr());
    let path = dir.path().join("memlendd.toml");
    let text = format!(
        "# a donor for tests\nlend = \"64M\"\nlisten = \"{file_addr}\"\ninsecure = true\n\
         max_per_borrower = \"8M\"\n"
    );
    std::fs::write(&path, text).unwrap();
    let ok = Command::new(BIN).arg("--check-config").arg(&path).output().unwrap();
    assert!(ok.status.success(), "{ok:?}");

    let mut reaped = Reaped(
        Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .args(["--listen", &addr.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_listening(addr, &mut reaped.0);
    assert!(!answers(file_addr), "the flag's --listen wins over the file's");
    let s = RemoteStore::open(addr, ClientConfig::new(None), 1024).unwrap();
    let data: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 241) as u8).collect();
    s.write(&[WriteOp { page: 7, data: &data }]).unwrap();
    let mut back = vec![0u8; PAGE_SIZE];
    s.read(&mut [ReadOp { page: 7, buf: &mut back }]).unwrap();
    assert!(back == data, "a page read back differs");
    assert!(RemoteStore::open(addr, ClientConfig::new(None), 4096).is_err(), "over the file's cap");
    assert!(stop_by_sigterm(&mut reaped.0).success());

    std::fs::write(&path, "lend = \"64M\"\n\nspin_us = \"fast\"\n").unwrap();
    let bad = Command::new(BIN).arg("--check-config").arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("line 3") && err.contains("spin_us"), "{err}");
}

/// The config the package ships is one the daemon accepts.
#[test]
fn the_shipped_config_is_valid() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/memlendd.toml");
    let out = Command::new(BIN).arg("--check-config").arg(shipped).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
