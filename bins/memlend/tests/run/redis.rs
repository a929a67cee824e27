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

/// A redis-server on a free port, and a connection to it.
struct Redis {
    guard: Reaped,
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Redis {
    /// `run`: the command that starts redis-server (`memlend run ... --`,
    /// or nothing); `dir`: where its dump goes.
    fn start(run: &[&str], dir: &std::path::Path) -> Redis {
        let redis = Command::new("redis-server").arg("--version").output();
        assert!(
            redis.is_ok(),
            "redis-server is needed: install redis-server (scripts/setup.sh does)"
        );
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (program, args) = match run.split_first() {
            Some((program, args)) => (*program, args.to_vec()),
            None => ("redis-server", Vec::new()),
        };
        let args = args.into_iter().chain(run.first().map(|_| "redis-server"));
        let mut guard = Reaped(
            Command::new(program)
                .args(args)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--dir", dir.to_str().unwrap()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stream = connect(port, &mut guard.0);
        let w = stream.try_clone().unwrap();
        let mut redis = Redis { guard, w, r: BufReader::new(stream) };
        redis.wait_loaded();
        redis
    }

    /// A server that loads a dump answers -LOADING until it is done.
    fn wait_loaded(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut buf = Vec::new();
            command(&mut buf, &[b"PING"]);
            self.w.write_all(&buf).unwrap();
            let mut line = String::new();
            self.r.read_line(&mut line).unwrap();
            if line == "+PONG\r\n" {
                return;
            }
            assert!(line.starts_with("-LOADING"), "PING: {line:?}");
            assert!(Instant::now() < deadline, "redis-server still loading after a minute");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn call(&mut self, parts: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        command(&mut buf, parts);
        self.w.write_all(&buf).unwrap();
        reply(&mut self.r)
    }

    /// SET key:i to `value(i)` for every key, in pipelined bursts.
    fn set_all(&mut self, value: impl Fn(usize) -> Vec<u8>) {
        for start in (0..KEYS).step_by(BURST) {
            let mut buf = Vec::new();
            for i in start..(start + BURST).min(KEYS) {
                command(&mut buf, &[b"SET", format!("key:{i}").as_bytes(), &value(i)]);
            }
            self.w.write_all(&buf).unwrap();
            for _ in start..(start + BURST).min(KEYS) {
                assert_eq!(reply(&mut self.r), b"OK");
            }
        }
    }

    /// Every key reads `value(i)`, and there are no others.
    fn check_all(&mut self, value: impl Fn(usize) -> Vec<u8>) {
        for start in (0..KEYS).step_by(BURST) {
            let mut buf = Vec::new();
            for i in start..(start + BURST).min(KEYS) {
                command(&mut buf, &[b"GET", format!("key:{i}").as_bytes()]);
            }
            self.w.write_all(&buf).unwrap();
            for i in start..(start + BURST).min(KEYS) {
                assert!(reply(&mut self.r) == value(i), "key:{i} came back different");
            }
        }
        assert_eq!(self.call(&[b"DBSIZE"]), KEYS.to_string().as_bytes());
    }

    /// SHUTDOWN NOSAVE (redis exits without answering), and its stderr.
    fn stop(mut self) -> String {
        let mut buf = Vec::new();
        command(&mut buf, &[b"SHUTDOWN", b"NOSAVE"]);
        self.w.write_all(&buf).unwrap();
        let server = &mut self.guard.0;
        let mut err = String::new();
        std::io::Read::read_to_string(server.stderr.as_mut().unwrap(), &mut err).unwrap();
        server.wait().unwrap();
        err
    }
}

/// The `memlend run` command line for redis-server over the SSD tier in
/// `dir`, with `extra` options.
fn memlend_redis<'a>(dir: &'a str, shim: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut run = vec![MEMLEND, "run", "--preload", shim, "--local", "16M", "--ssd", dir];
    run.extend_from_slice(extra);
    run.push("--");
    run
}

/// `extra`: more `memlend run` options. The far summary is returned.
pub fn keeps_every_value(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let shim = shim();
    let run = memlend_redis(dir.path().to_str().unwrap(), shim.to_str().unwrap(), extra);
    let mut redis = Redis::start(&run, dir.path());
    redis.set_all(value);
    redis.check_all(value);
    let err = redis.stop();
    assert!(faults_from_store(&err) > 0, "far memory was not used:\n{err}");
    err
}

fn value_after(i: usize) -> Vec<u8> {
    let mut v = value(i);
    v[..8].copy_from_slice(b"rewrite:");
    v
}

/// BGSAVE forks; the child writes the dataset as it was at the fork while
/// the parent rewrites every key. A plain redis-server then loads the dump
/// and finds every value as it was before the rewrite. No flag: forks are
/// followed by default.
#[test]
fn bgsave_under_memlend_writes_the_dataset_as_at_its_fork() {
    let dir = tempfile::tempdir().unwrap();
    let shim = shim();
    let run = memlend_redis(dir.path().to_str().unwrap(), shim.to_str().unwrap(), &[]);
    let mut redis = Redis::start(&run, dir.path());
    redis.set_all(value);
    // The child sleeps 20 us a key, so it reads most pages after the
    // parent has rewritten them and written them back to the store.
    let err = bgsave_while_rewriting(redis);
    assert!(err.contains("fork"), "the summary says nothing of the fork:\n{err}");

    let mut plain = Redis::start(&[], dir.path());
    plain.check_all(value);
    plain.stop();
}

/// BGSAVE, with the child slowed down (20 us a key, so it reads most pages
/// after the parent has rewritten them and written them back to the
/// store), while every key is rewritten; then every key reads its new
/// value. Returns the run's stderr.
fn bgsave_while_rewriting(mut redis: Redis) -> String {
    assert_eq!(redis.call(&[b"CONFIG", b"SET", b"rdb-key-save-delay", b"20"]), b"OK");
    assert_eq!(redis.call(&[b"BGSAVE"]), b"Background saving started");
    redis.set_all(value_after);
    let deadline = Instant::now() + Duration::from_secs(120);
    let info = loop {
        let info = String::from_utf8(redis.call(&[b"INFO", b"persistence"])).unwrap();
        if info.contains("rdb_bgsave_in_progress:0") {
            break info;
        }
        assert!(Instant::now() < deadline, "BGSAVE still running after 2 minutes");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(info.contains("rdb_last_bgsave_status:ok"), "{info}");
    redis.check_all(value_after);
    let err = redis.stop();
    assert!(faults_from_store(&err) > 0, "far memory was not used:\n{err}");
    // Pages the parent still held unchanged went from its memory (0.7-1.8 K
    // of ~124 K in 6 runs): the dump checked after covers those copies too.
    let copied = err
        .split(" of them copied from its memory")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(copied.is_some_and(|n| n > 0), "no page copied from the parent's memory:\n{err}");
    err
}

/// The same under `--mem` in a memory cgroup of as much, a third of what
/// redis holds: the parent writes its dirty pages out at the fork, the
/// child shares none, the old pages it owes go to disk, and room is made
/// for it. Before that, the cgroup OOM-killed redis during the BGSAVE.
#[test]
fn bgsave_in_a_binding_memory_cgroup_is_not_oom_killed_and_saves_the_fork_moment() {
    let Some(cg) = crate::mem_cgroup::TestCgroup::try_make("bgsave", 40 << 20) else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let shim = shim();
    let cg_dir = cg.dir.to_str().unwrap();
    let join = crate::mem_cgroup::JOIN_CGROUP;
    let mut run = vec!["sh", "-c", join, cg_dir, MEMLEND, "run", "--preload"];
    run.extend([shim.to_str().unwrap(), "--mem", "40M", "--ssd", d]);
    run.extend(["--fork-spill", d, "--"]);
    let mut redis = Redis::start(&run, dir.path());
    redis.set_all(value);
    let err = bgsave_while_rewriting(redis);
    assert_eq!(cg.oom_kills(), 0, "the cgroup killed a process:\n{err}");
    let wrote = err
        .split("which wrote ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(wrote.is_some_and(|n| n > 0), "no dirty page written out for the fork:\n{err}");
    // The default clean is lazy: those pages were written after the fork.
    let after = err
        .split(" of them after the fork")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(after, wrote, "the dirty pages were not all written after the fork:\n{err}");

    let mut plain = Redis::start(&[], dir.path());
    plain.check_all(value);
    plain.stop();
}
