//! memlendd's NBD flags with real clients: read-only exports (--nbd-read-only
//! and `--export NAME=SIZE,ro`) against qemu-io and nbdinfo, and the Unix
//! socket listener (--nbd-unix) against nbdcopy and nbdinfo, its file's
//! mode, removal on a clean stop and replacement when stale.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_memlendd");

/// Fail (never skip) when an external client is missing.
fn require_tool(tool: &str, apt_package: &str) {
    if let Err(e) = Command::new(tool).arg("--version").output() {
        panic!(
            "`{tool}` is needed by this test but cannot run ({e}): apt-get install {apt_package}"
        );
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A daemon killed when the test ends, even by a failed assertion.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Daemon {
    /// memlendd lending 64 MiB with `args`, once `ready` says it serves.
    fn start(args: &[&str], ready: impl Fn() -> bool) -> Daemon {
        let mut child = Command::new(BIN)
            .args(["--lend", "64M", "--insecure", "--listen", &free_addr().to_string()])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut log = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut log).unwrap();
                panic!("memlendd {args:?} exited early ({status}):\n{log}");
            }
            assert!(Instant::now() < deadline, "memlendd {args:?} did not start serving");
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon(child)
    }

    /// SIGTERM, and the exit status within 10 s.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "memlendd did not stop within 10 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn must(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn qemu_io(uri: &str, command: &str) -> Output {
    run(Command::new("qemu-io").args(["-f", "raw", "-c", command]).arg(uri))
}

fn refusal(args: &[&str]) -> String {
    let out = Command::new(BIN).args(["--lend", "16M", "--insecure"]).args(args).output().unwrap();
    assert!(!out.status.success(), "memlendd {args:?} should refuse");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// qemu-io sees READ_ONLY and refuses to open the export for writing
/// ("Permission denied"); were it to send the write, the server's EPERM
/// would read "Operation not permitted".
fn assert_refused_by_qemu_io(uri: &str, op: &str) {
    let said = text(&qemu_io(uri, op));
    let refused = said.contains("Permission denied") || said.contains("Operation not permitted");
    assert!(refused && !said.contains("wrote"), "`{op}` on {uri}:\n{said}");
}

/// A write, a trim and a write-zeroes to a read-only export each fail with
/// a permission error (from qemu-io, and EPERM from the server itself when
/// sent anyway) and leave its bytes as they were; the writable export
/// beside it takes the same write.
fn assert_read_only(ro: &str, rw: &str, raw: (SocketAddr, &str)) {
    for op in ["write -P 0x5a 0 64k", "discard 0 64k", "write -z 0 64k"] {
        assert_refused_by_qemu_io(ro, op);
    }
    raw_writes_get_eperm(raw.0, raw.1);
    let out =
        run(Command::new("qemu-io").args(["-r", "-f", "raw", "-c", "read -P 0 0 1M"]).arg(ro));
    assert!(text(&out).contains("read 1048576/1048576"), "{}", text(&out));
    let out = qemu_io(rw, "write -P 0x5a 0 64k");
    assert!(text(&out).contains("wrote 65536/65536"), "{}", text(&out));
    let out = qemu_io(rw, "read -P 0x5a 0 64k");
    assert!(text(&out).contains("read 65536/65536"), "{}", text(&out));
    let info = must(Command::new("nbdinfo").arg("--json").arg(ro));
    assert!(info.contains("\"is_read_only\": true"), "{info}");
    let info = must(Command::new("nbdinfo").arg("--json").arg(rw));
    assert!(info.contains("\"is_read_only\": false"), "{info}");
}

#[test]
fn an_export_marked_ro_refuses_writes_from_qemu_io() {
    require_tool("qemu-io", "qemu-utils");
    require_tool("nbdinfo", "libnbd-bin");
    let nbd = free_addr();
    let args = ["--nbd", &nbd.to_string(), "--export", "rw=4M", "--export", "ro=4M,ro"];
    let d = Daemon::start(&args, || memlend_net::someone_listens(nbd));
    assert_read_only(&format!("nbd://{nbd}/ro"), &format!("nbd://{nbd}/rw"), (nbd, "ro"));
    assert!(d.stop().success());
}

/// --nbd-read-only: every export, here the default one, over the Unix
/// socket too.
#[test]
fn nbd_read_only_covers_every_export_and_listener() {
    require_tool("qemu-io", "qemu-utils");
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let nbd = free_addr();
    let args =
        ["--nbd", &nbd.to_string(), "--nbd-unix", socket.to_str().unwrap(), "--nbd-read-only"];
    let d = Daemon::start(&args, || socket.exists() && memlend_net::someone_listens(nbd));
    for uri in [format!("nbd://{nbd}"), format!("nbd+unix:///?socket={}", socket.display())] {
        assert_refused_by_qemu_io(&uri, "write -P 0x5a 0 4k");
        let info = must(Command::new("nbdinfo").arg("--json").arg(&uri));
        assert!(info.contains("\"is_read_only\": true"), "{info}");
    }
    raw_writes_get_eperm(nbd, "");
    assert!(d.stop().success());
}

/// What clients that honour READ_ONLY never send: a raw NBD client picks
/// `name` (NBD_OPT_EXPORT_NAME), sees READ_ONLY, sends WRITE, TRIM and
/// WRITE_ZEROES anyway and gets EPERM for each; a READ then gives zeros.
fn raw_writes_get_eperm(addr: SocketAddr, name: &str) {
    use memlend_wire::nbd::{opt, tx_flags, ClientFlags, Command as Cmd, OptHeader, Request};
    use std::io::{Read, Write};
    const EPERM: u32 = 1;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; memlend_wire::nbd::GREETING_LEN];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&ClientFlags { fixed_newstyle: true, no_zeroes: true }.encode()).unwrap();
    let header = OptHeader { option: opt::EXPORT_NAME, len: name.len() as u32 };
    s.write_all(&header.encode()).unwrap();
    s.write_all(name.as_bytes()).unwrap();
    let mut export = [0u8; 10]; // size u64, transmission flags u16
    s.read_exact(&mut export).unwrap();
    let flags = u16::from_be_bytes([export[8], export[9]]);
    assert_ne!(flags & tx_flags::READ_ONLY, 0, "READ_ONLY not advertised");
    let reply = |s: &mut TcpStream, data: usize| {
        let mut head = vec![0u8; 16 + data];
        s.read_exact(&mut head[..16]).unwrap();
        let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
        if error == 0 {
            s.read_exact(&mut head[16..]).unwrap();
        }
        (error, head.split_off(16))
    };
    for (cookie, cmd) in [(1, Cmd::Write), (2, Cmd::Trim), (3, Cmd::WriteZeroes)] {
        s.write_all(&Request::new(cmd, cookie, 0, 4096).encode()).unwrap();
        if cmd == Cmd::Write {
            s.write_all(&[0x5a; 4096]).unwrap();
        }
        assert_eq!(reply(&mut s, 0).0, EPERM, "{cmd:?} on a read-only export");
    }
    s.write_all(&Request::new(Cmd::Read, 4, 0, 4096).encode()).unwrap();
    let (error, data) = reply(&mut s, 4096);
    assert!(error == 0 && data.iter().all(|&b| b == 0), "the bytes changed");
    s.write_all(&Request::new(Cmd::Disc, 5, 0, 0).encode()).unwrap();
}

/// --nbd-unix alone: nbdcopy writes a named export and reads it back,
/// nbdinfo sees the default one; the file is a 0660 socket, and is gone
/// after SIGTERM.
#[test]
fn nbd_unix_serves_and_its_file_goes_on_a_clean_stop() {
    require_tool("nbdcopy", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let args = ["--nbd-unix", socket.to_str().unwrap(), "--export", "a=4M", "--export", "b=8M"];
    let d = Daemon::start(&args, || socket.exists());
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    copy_and_read_back(dir.path(), &format!("nbd+unix:///b?socket={}", socket.display()));
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let size = must(Command::new("nbdinfo").arg("--size").arg(uri));
    assert_eq!(size.trim(), (4 << 20).to_string(), "the default export is the first");
    assert!(d.stop().success());
    assert!(!socket.exists(), "the socket file is removed on a clean stop");
}

/// 3 MiB of a pattern written with nbdcopy comes back the same.
fn copy_and_read_back(dir: &Path, uri: &str) {
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    let src = dir.join("src.bin");
    std::fs::write(&src, &data).unwrap();
    must(Command::new("nbdcopy").arg(&src).arg(uri));
    let back = dir.join("back.bin");
    must(Command::new("nbdcopy").arg(uri).arg(&back));
    let back = std::fs::read(&back).unwrap();
    assert!(back[..data.len()] == data[..], "bytes read back from {uri} differ");
}

/// A socket file left by a crashed run (nobody listens) is replaced.
#[test]
fn a_stale_socket_is_replaced() {
    require_tool("nbdcopy", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    drop(UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "a dropped listener leaves its file, as a crash does");
    let args = ["--nbd-unix", socket.to_str().unwrap()];
    let d = Daemon::start(&args, || std::os::unix::net::UnixStream::connect(&socket).is_ok());
    copy_and_read_back(dir.path(), &format!("nbd+unix:///?socket={}", socket.display()));
    assert!(d.stop().success());
}

#[test]
fn a_path_in_use_or_not_a_socket_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "precious").unwrap();
    let err = refusal(&["--nbd-unix", file.to_str().unwrap()]);
    assert!(err.contains("plain-file") && err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious", "the file is left alone");
    let live = dir.path().join("live.sock");
    let _listening = UnixListener::bind(&live).unwrap();
    let err = refusal(&["--nbd-unix", live.to_str().unwrap()]);
    assert!(err.contains("live.sock") && err.contains("already listens"), "{err}");
}

#[test]
fn read_only_without_nbd_is_refused() {
    let err = refusal(&["--export", "a=4M,ro"]);
    assert!(err.contains("--nbd ADDR"), "{err}");
    let err = refusal(&["--nbd-read-only"]);
    assert!(err.contains("--nbd ADDR"), "{err}");
}

/// A key file that is not a key names itself, not the certificate.
#[test]
fn a_garbage_tls_key_is_refused_naming_the_key_file() {
    require_tool("openssl", "openssl");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, bad) =
        (dir.path().join("cert.pem"), dir.path().join("key.pem"), dir.path().join("bad-key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2432",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&bad, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    let nbd = ["--nbd", "127.0.0.1:0", "--nbd-tls-cert", cert.to_str().unwrap()];
    let err = refusal(&[&nbd[..], &["--nbd-tls-key", bad.to_str().unwrap()]].concat());
    assert!(err.contains("bad-key.pem") && !err.contains("cert.pem"), "{err}");
    // The 2432-bit key itself (refused by ring) is taken: the daemon runs.
    let addr = free_addr().to_string();
    let key = key.to_str().unwrap();
    let tls = [&["--nbd", &addr][..], &nbd[2..], &["--nbd-tls-key", key]].concat();
    let d = Daemon::start(&tls, || memlend_net::someone_listens(addr.parse().unwrap()));
    assert!(d.stop().success());
}
