//! redis-server (Debian's, with its own jemalloc) under `memlend run`, its
//! dataset 4x the local budget, every value read back and compared.

use crate::common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: usize = 48 * 1024;
const VALUE_BYTES: usize = 1024;
/// Commands in flight per pipelined burst.
const BURST: usize = 512;

fn value(i: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
    (0..VALUE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

fn command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for p in parts {
        out.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
}

/// One RESP reply: a simple line, or a bulk string's bytes.
fn reply(r: &mut BufReader<TcpStream>) -> Vec<u8> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).unwrap();
    assert!(line.ends_with(b"\r\n"), "short reply {line:?}");
    line.truncate(line.len() - 2);
    match line.first() {
        Some(b'+') | Some(b':') => line[1..].to_vec(),
        Some(b'$') => {
            let n: usize = std::str::from_utf8(&line[1..]).unwrap().parse().unwrap();
            let mut buf = vec![0u8; n + 2];
            std::io::Read::read_exact(r, &mut buf).unwrap();
            buf.truncate(n);
            buf
        }
        _ => panic!("redis says {}", String::from_utf8_lossy(&line)),
    }
}

fn connect(port: u16, server: &mut std::process::Child) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            // A server that stops answering fails the test, not hangs it.
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            return s;
        }
        assert!(server.try_wait().unwrap().is_none(), "redis-server exited early");
        assert!(Instant::now() < deadline, "redis-server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `extra`: more `memlend run` options. The far summary is returned.
pub fn keeps_every_value(extra: &[&str]) -> String {
    let redis = Command::new("redis-server").arg("--version").output();
    assert!(redis.is_ok(), "redis-server is needed: install redis-server (scripts/setup.sh does)");
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut guard = Reaped(
        Command::new(MEMLEND)
            .args(["run", "--preload", shim().to_str().unwrap(), "--local", "16M"])
            .args(["--ssd", dir.path().to_str().unwrap()])
            .args(extra)
            .args(["--", "redis-server"])
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--dir", dir.path().to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let server = &mut guard.0;
    let stream = connect(port, server);
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    for start in (0..KEYS).step_by(BURST) {
        let mut buf = Vec::new();
        for i in start..(start + BURST).min(KEYS) {
            command(&mut buf, &[b"SET", format!("key:{i}").as_bytes(), &value(i)]);
        }
        w.write_all(&buf).unwrap();
        for _ in start..(start + BURST).min(KEYS) {
            assert_eq!(reply(&mut r), b"OK");
        }
    }
    for start in (0..KEYS).step_by(BURST) {
        let mut buf = Vec::new();
        for i in start..(start + BURST).min(KEYS) {
            command(&mut buf, &[b"GET", format!("key:{i}").as_bytes()]);
        }
        w.write_all(&buf).unwrap();
        for i in start..(start + BURST).min(KEYS) {
            assert!(reply(&mut r) == value(i), "key:{i} came back different");
        }
    }
    let mut buf = Vec::new();
    command(&mut buf, &[b"DBSIZE"]);
    w.write_all(&buf).unwrap();
    assert_eq!(reply(&mut r), KEYS.to_string().as_bytes());
    // Redis exits on SHUTDOWN without answering it.
    buf.clear();
    command(&mut buf, &[b"SHUTDOWN", b"NOSAVE"]);
    w.write_all(&buf).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(server.stderr.as_mut().unwrap(), &mut err).unwrap();
    server.wait().unwrap();
    assert!(faults_from_store(&err) > 0, "far memory was not used:\n{err}");
    err
}
