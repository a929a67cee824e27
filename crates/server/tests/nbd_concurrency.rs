//! Many requests in flight, many connections: pipelined batches, replies out
//! of order on slow stores, sub-page writes to one page from many
//! connections, and DISC answering everything still queued.

mod nbd_common;

use memlend_server::nbd::{Export, NbdConfig};
use memlend_store::PageStore;
use memlend_wire::nbd::{Command, Request};
use nbd_common::*;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

#[test]
fn a_read_overtakes_a_slow_flush() {
    let store = slow_store(256, Duration::from_millis(400));
    let srv = TestServer::start(vec![Export::new("slow", store)], NbdConfig::default());
    let mut c = RawClient::connect(srv.port, "", false);
    assert_eq!(c.write(4096, &[7u8; 4096]), 0);
    let started = Instant::now();
    c.send(Request::new(Command::Flush, 100, 0, 0), &[]);
    c.send(Request::new(Command::Read, 101, 4096, 4096), &[]);
    let first = c.recv(4096).unwrap();
    assert_eq!(first.cookie, 101, "the read waited behind the flush");
    assert!(started.elapsed() < Duration::from_millis(300), "read took {:?}", started.elapsed());
    assert_eq!((first.error, first.data), (0, vec![7u8; 4096]));
    let second = c.recv(0).unwrap();
    assert_eq!((second.cookie, second.error), (100, 0));
    assert!(started.elapsed() >= Duration::from_millis(400), "flush answered before it finished");
    c.disconnect();
}

/// Each of `conns` connections owns one unaligned slot in every page and
/// rewrites it in pipelined bursts (so the server does back-to-back
/// read-modify-writes on the same pages from several threads), then reads
/// its slots back. A lost update leaves an older value in some slot.
fn sub_page_writers(srv: &TestServer, conns: u64, pages: u64, rounds: u64) {
    let slot = 4096 / conns; // 585 bytes for 7 connections: unaligned
    let burst = 64u64;
    let value = |i: u64, r: u64, p: u64| (i * 37 + r * 3 + p + 1) as u8;
    let threads: Vec<_> = (0..conns)
        .map(|i| {
            let mut c = RawClient::connect(srv.port, "", i % 2 == 0);
            thread::spawn(move || {
                for r in 0..rounds {
                    let mut wire = Vec::new();
                    for k in 0..burst {
                        let p = k % pages;
                        let data = vec![value(i, r, p); slot as usize];
                        wire.extend(
                            Request::new(Command::Write, k, p * 4096 + i * slot, slot as u32)
                                .encode(),
                        );
                        wire.extend(data);
                    }
                    c.send(Request::new(Command::Flush, 1000, 0, 0), &wire);
                    for _ in 0..=burst {
                        assert_eq!(c.recv(0).unwrap().error, 0);
                    }
                    for p in 0..pages {
                        let got = c.read(p * 4096 + i * slot, slot as u32).unwrap();
                        let want = value(i, r, p);
                        assert!(
                            got.iter().all(|&b| b == want),
                            "lost update: conn {i} page {p} round {r}"
                        );
                    }
                }
                c.disconnect();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all = srv.store_bytes(0, 0, (pages * 4096) as usize);
    for p in 0..pages {
        for i in 0..conns {
            let at = (p * 4096 + i * slot) as usize;
            let want = value(i, rounds - 1, p);
            assert!(
                all[at..at + slot as usize].iter().all(|&b| b == want),
                "lost update: page {p} slot {i}"
            );
        }
    }
}

#[test]
fn sub_page_writes_from_many_connections_lose_nothing_inline() {
    let srv = TestServer::ram(64);
    sub_page_writers(&srv, 7, 1, 300);
}

#[test]
fn sub_page_writes_from_many_connections_lose_nothing_pooled() {
    let store = slow_store(64, Duration::ZERO);
    let srv = TestServer::start(vec![Export::new("slow", store)], NbdConfig::default());
    sub_page_writers(&srv, 7, 1, 150);
}

/// 200 requests sent in one go, replies read afterwards: every one is
/// answered, in order on a fast store, with the right bytes.
#[test]
fn a_pipelined_burst_is_answered_completely() {
    let srv = TestServer::ram(1024);
    for structured in [false, true] {
        let mut c = RawClient::connect(srv.port, "", structured);
        let mut wire = Vec::new();
        for i in 0..100u64 {
            let data = pattern(i, 3000);
            wire.extend(Request::new(Command::Write, 2 * i, i * 5000, 3000).encode());
            wire.extend(&data);
            wire.extend(Request::new(Command::Read, 2 * i + 1, i * 5000, 3000).encode());
        }
        c.send(Request::new(Command::Flush, 999, 0, 0), &wire);
        assert_eq!(c.recv(0).unwrap().cookie, 999);
        for i in 0..100u64 {
            let w = c.recv(0).unwrap();
            assert_eq!((w.cookie, w.error), (2 * i, 0));
            let r = c.recv(3000).unwrap();
            assert_eq!((r.cookie, r.error), (2 * i + 1, 0));
            assert!(r.data == pattern(i, 3000), "read {i} returned other bytes");
        }
        c.disconnect();
    }
}

/// DISC right behind queued writes on the worker pool: every write is
/// answered and stored before the server closes.
#[test]
fn disc_answers_everything_queued_first() {
    let store = slow_store(1024, Duration::from_millis(50));
    let srv =
        TestServer::start(vec![Export::new("slow", Arc::clone(&store) as _)], NbdConfig::default());
    let mut c = RawClient::connect(srv.port, "", true);
    let mut wire = Vec::new();
    for i in 0..50u64 {
        wire.extend(
            Request { flags: 1, ..Request::new(Command::Write, i, i * 4096, 4096) }.encode(),
        );
        wire.extend(pattern(i, 4096));
    }
    wire.extend(Request::new(Command::Disc, 1000, 0, 0).encode());
    c.send(Request::new(Command::Flush, 500, 0, 0), &wire);
    let mut seen: Vec<u64> = (0..51).map(|_| c.recv(0).unwrap()).map(|r| r.cookie).collect();
    seen.sort_unstable();
    let mut want: Vec<u64> = (0..50).collect();
    want.push(500);
    assert_eq!(seen, want);
    assert!(closes_soon(&mut c.s));
    for i in 0..50u64 {
        assert!(srv.store_bytes(0, i * 4096, 4096) == pattern(i, 4096));
    }
    assert_eq!(store.info().pages, 1024);
}

/// What one connection wrote (and got a reply for) is what every other
/// connection reads next: one store, no per-connection cache.
#[test]
fn writes_are_visible_to_other_connections_at_once() {
    let srv = TestServer::ram(256);
    let mut a = RawClient::connect(srv.port, "", false);
    let mut b = RawClient::connect(srv.port, "mem", true);
    for i in 0..50u64 {
        let data = pattern(i + 1, 1000 + i as usize);
        assert_eq!(a.write(i * 3001, &data), 0);
        assert!(b.read(i * 3001, data.len() as u32).unwrap() == data);
    }
    a.disconnect();
    b.disconnect();
}
