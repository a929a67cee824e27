//! fio's nbd engine (libnbd) against the server: random writes at queue
//! depth > 1 on several connections at once (multi-conn), each verified with
//! CRC32C on read-back; with flushes; with unaligned sizes; and through the
//! worker pool of a slow store.

mod nbd_common;

use memlend_server::nbd::{Export, NbdConfig};
use nbd_common::*;
use std::process::Command;
use std::time::Duration;

/// Run fio with `args` against `uri`; fail on any error it reports.
fn fio(uri: &str, args: &[&str]) -> String {
    require_tool("fio", "fio");
    let out = Command::new("fio")
        .args([
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--group_reporting",
            "--output-format=json",
        ])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--exitall_on_error=1"])
        // fio would leave a verify state file in the working directory.
        .arg("--verify_state_save=0")
        .current_dir(std::env::temp_dir())
        .args(args)
        .output()
        .expect("cannot run fio");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed ({}):\n{text}\n{err}", out.status);
    assert!(text.contains("\"error\" : 0"), "fio reported an error:\n{text}");
    assert!(!err.contains("verify"), "fio reported a verify problem:\n{err}");
    text
}

/// Bytes fio says it read in its verify pass, from the JSON output.
fn read_bytes(json: &str) -> u64 {
    let at = json.find("\"read\" : {").expect("no read section");
    let rest = &json[at..];
    let at = rest.find("\"io_bytes\" : ").unwrap() + "\"io_bytes\" : ".len();
    rest[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn random_writes_from_four_connections_verify() {
    let srv = TestServer::ram(16384); // 64 MiB: 4 jobs x 16 MiB
    let json = fio(
        &srv.uri(""),
        &[
            "--name=mc",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--numjobs=4",
            "--size=16M",
            "--offset_increment=16M",
        ],
    );
    assert_eq!(read_bytes(&json), 64 << 20, "verify pass did not read everything back");
}

#[test]
fn unaligned_sizes_with_flushes_verify() {
    let srv = TestServer::ram(8192);
    let json = fio(
        &srv.uri(""),
        &[
            "--name=odd",
            "--rw=randwrite",
            "--bsrange=512-24k",
            "--blockalign=512",
            "--iodepth=8",
            "--numjobs=2",
            "--size=8M",
            "--offset_increment=8M",
            "--fsync=16",
        ],
    );
    assert_eq!(read_bytes(&json), 16 << 20);
}

#[test]
fn slow_store_through_the_worker_pool_verifies() {
    let store = slow_store(8192, Duration::from_micros(200));
    let srv = TestServer::start(vec![Export::new("slow", store)], NbdConfig::default());
    let json = fio(
        &srv.uri(""),
        &[
            "--name=slow",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--numjobs=2",
            "--size=8M",
            "--offset_increment=8M",
            "--fsync=64",
        ],
    );
    assert_eq!(read_bytes(&json), 16 << 20);
}
