//! The NBD server on a Unix socket beside TCP, with real clients: nbdcopy,
//! nbdinfo and qemu-img over `nbd+unix://`. Both listeners serve the same
//! stores, under one connection limit.

mod nbd_common;

use memlend_server::nbd::{Export, NbdConfig};
use nbd_common::*;
use std::path::Path;
use std::process::Command;

fn unix_uri(socket: &Path, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", socket.display())
}

fn must(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {}\nstderr: {err}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn two_exports(dir: &Path, cfg: NbdConfig) -> TestServer {
    let exports = vec![Export::new("a", ram(1024)), Export::new("b", ram(2048))];
    TestServer::start_with_unix(exports, cfg, &dir.join("nbd.sock"))
}

/// nbdcopy writes a named export over the Unix socket; the store holds
/// those bytes, nbdcopy reads them back there, and a TCP client of the same
/// server sees them too.
#[test]
fn nbdcopy_writes_and_reads_back_over_the_unix_socket() {
    require_tool("nbdcopy", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let srv = two_exports(dir.path(), NbdConfig::default());
    let socket = dir.path().join("nbd.sock");
    let data = pattern(3, 5 << 20);
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    must(Command::new("nbdcopy").arg(&src).arg(unix_uri(&socket, "b")));
    assert!(srv.store_bytes(1, 0, data.len()) == data, "the store holds other bytes");
    let back = dir.path().join("back.bin");
    must(Command::new("nbdcopy").arg(unix_uri(&socket, "b")).arg(&back));
    let back = std::fs::read(&back).unwrap();
    assert_eq!(back.len(), 8 << 20);
    assert!(back[..data.len()] == data[..], "bytes read back over the socket differ");
    let tcp_back = dir.path().join("tcp.bin");
    must(Command::new("nbdcopy").arg(srv.uri("b")).arg(&tcp_back));
    assert!(std::fs::read(&tcp_back).unwrap() == back, "TCP sees other bytes");
}

/// The empty name is the first export; nbdinfo and qemu-img see sizes.
#[test]
fn nbdinfo_and_qemu_img_see_the_exports_over_the_unix_socket() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("qemu-img", "qemu-utils");
    let dir = tempfile::tempdir().unwrap();
    let _srv = two_exports(dir.path(), NbdConfig::default());
    let socket = dir.path().join("nbd.sock");
    let size = must(Command::new("nbdinfo").arg("--size").arg(unix_uri(&socket, "")));
    assert_eq!(size.trim(), (4 << 20).to_string());
    let size = must(Command::new("nbdinfo").arg("--size").arg(unix_uri(&socket, "b")));
    assert_eq!(size.trim(), (8 << 20).to_string());
    let info =
        must(Command::new("qemu-img").args(["info", "--output=json"]).arg(unix_uri(&socket, "b")));
    assert!(info.contains("\"virtual-size\": 8388608"), "{info}");
}

/// The allowlist is about addresses; a Unix client has none and is let
/// in (the socket file's mode is the access control), while TCP clients
/// outside the list are still closed.
#[test]
fn the_allowlist_does_not_apply_to_the_unix_socket() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let cfg = NbdConfig { allow: vec!["10.0.0.0/8".parse().unwrap()], ..NbdConfig::default() };
    let srv = two_exports(dir.path(), cfg);
    let socket = dir.path().join("nbd.sock");
    must(Command::new("nbdinfo").arg(unix_uri(&socket, "a")));
    let tcp = Command::new("nbdinfo").arg(srv.uri("a")).output().unwrap();
    assert!(!tcp.status.success(), "a TCP client outside 10.0.0.0/8 got in");
}

/// The connection limit counts Unix and TCP clients together.
#[test]
fn the_connection_limit_covers_both_listeners() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempfile::tempdir().unwrap();
    let cfg = NbdConfig { connections_max: 1, ..NbdConfig::default() };
    let srv = two_exports(dir.path(), cfg);
    let socket = dir.path().join("nbd.sock");
    let held = RawClient::connect(srv.port, "a", false);
    let refused = Command::new("nbdinfo").arg(unix_uri(&socket, "a")).output().unwrap();
    assert!(!refused.status.success(), "a second client past connections_max = 1 got in");
    held.disconnect();
    // The slot is free once the server has seen the first one go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while srv.shutdown.live_connections() > 0 {
        assert!(std::time::Instant::now() < deadline, "the first connection never ended");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    must(Command::new("nbdinfo").arg(unix_uri(&socket, "a")));
}
