//! Exactly-once across reconnects: a broken connection resumes its session,
//! unanswered requests are sent again, and the donor applies each one once.

mod common;

use common::{page_pattern, Donor, Proxy};
use memlend_remote::{ClientConfig, ClientError, Conn, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use memlend_wire::page::{self, Opcode, ReqHeader, StatReply, Status};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

fn cut() -> ClientError {
    ClientError::Io(io::Error::new(io::ErrorKind::ConnectionReset, "cut by the test"))
}

fn free_pages(conn: &mut Conn) -> u64 {
    conn.call(ReqHeader::new(Opcode::Stat, 0), &[], None).unwrap();
    StatReply::decode(conn.scratch()).unwrap().free_pages
}

/// An OPEN whose reply is lost is answered again from the session's
/// window after the resume: one slab, not two.
#[test]
fn a_replayed_open_is_not_applied_twice() {
    let donor = Donor::start(1000, None);
    let mut conn = Conn::connect(donor.addr, &ClientConfig::new(None)).unwrap();
    let open = ReqHeader { page: 300, ..ReqHeader::new(Opcode::OpenSlab, 0) };
    conn.queue(open, &[]);
    conn.send().unwrap();
    // Wait until the donor has applied it, then lose the reply.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while donor.server.stats().requests.load(Ordering::Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "the OPEN was never served");
        std::thread::sleep(Duration::from_millis(5));
    }
    conn.recover(cut()).unwrap();
    let reply = conn.recv(|_| None).unwrap();
    assert_eq!(reply.status, Status::Ok);
    assert_eq!(free_pages(&mut conn), 700, "the OPEN was applied twice");
    assert_eq!(donor.server.stats().replays.load(Ordering::Relaxed), 1);
    assert_eq!(conn.resumes, 1);
}

/// A stale copy of a write that reaches the donor after the session moved
/// on is fenced off: it cannot overwrite the newer write.
#[test]
fn a_stale_request_from_the_old_connection_is_fenced_off() {
    let donor = Donor::start(1000, None);
    let mut conn = Conn::connect(donor.addr, &ClientConfig::new(None)).unwrap();
    let open = ReqHeader { page: 16, ..ReqHeader::new(Opcode::OpenSlab, 0) };
    let slab = conn.call(open, &[], None).unwrap().value as u32;
    let old = conn.try_clone_stream().unwrap();
    // Write page 0 = A: half of the frame leaves on the old connection ...
    let (a, b) = (page_pattern(1, 0), page_pattern(2, 0));
    let h = ReqHeader { slab, page: 0, count: 1, ..ReqHeader::new(Opcode::Write, 0) };
    conn.queue(h, &[&a]);
    let frame = frame_of(conn.next_seq() - 1, conn.next_tag() - 1, h, &a);
    (&old).write_all(&frame[..frame.len() / 2]).unwrap();
    // ... then the connection "breaks": the session resumes elsewhere and
    // sends A again, whole; then page 0 = B.
    conn.recover(cut()).unwrap();
    assert_eq!(conn.recv(|_| None).unwrap().status, Status::Ok);
    let h2 = ReqHeader { slab, page: 0, count: 1, ..ReqHeader::new(Opcode::Write, 0) };
    conn.call(h2, &[&b], None).unwrap();
    // The rest of the stale frame arrives on the old connection.
    (&old).write_all(&frame[frame.len() / 2..]).unwrap();
    let mut byte = [0u8; 1];
    old.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let closed = matches!((&old).read(&mut byte), Ok(0) | Err(_));
    assert!(closed, "the old connection should be closed, not served");
    let mut got = vec![0u8; PAGE_SIZE];
    let read = ReqHeader { slab, page: 0, count: 1, ..ReqHeader::new(Opcode::Read, 0) };
    conn.call(read, &[], Some(&mut got)).unwrap();
    assert!(got == b, "a stale write overwrote a newer one");
}

/// The bytes `Conn::queue` put on the wire for `h` with `payload`.
fn frame_of(seq: u64, tag: u32, h: ReqHeader, payload: &[u8]) -> Vec<u8> {
    let h = ReqHeader {
        seq,
        tag,
        payload_len: payload.len() as u32,
        payload_crc: page::payload_crc(payload),
        ..h
    };
    [&h.encode()[..], payload].concat()
}

/// Connections cut again and again under a stream of writes: every page
/// ends with its last version.
#[test]
fn cuts_under_a_write_stream_lose_nothing() {
    let donor = Donor::start(4096, None);
    let proxy = Proxy::start(donor.addr);
    let mut cfg = ClientConfig::new(None);
    cfg.retries_max = 20;
    let s = RemoteStore::open(proxy.addr, cfg, 1024).unwrap();
    let done = AtomicBool::new(false);
    // Writes finished; the cutter waits for one between cuts, so every
    // write call meets at most one cut however slow the machine.
    let writes = AtomicU64::new(0);
    /// Stops the cutter however the writer ends, a panic included.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut cut_at = 0;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(40));
                // A cut before the last resume finished would cut the
                // resume itself: on a loaded machine, again and again.
                let now = writes.load(Ordering::Relaxed);
                if now > cut_at {
                    proxy.cut();
                    cut_at = now;
                }
            }
        });
        let _stop = Stop(&done);
        for round in 0..20u8 {
            for first in (0..1024).step_by(256) {
                let data: Vec<u8> =
                    (first..first + 256).flat_map(|p| page_pattern(round, p)).collect();
                s.write(&[WriteOp { page: first, data: &data }]).unwrap();
                writes.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let mut buf = vec![0u8; 1024 * PAGE_SIZE];
    s.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
    for (p, got) in buf.chunks(PAGE_SIZE).enumerate() {
        assert!(got == page_pattern(19, p as u64), "page {p} is not the last version");
    }
    assert!(s.reconnects() > 0, "the proxy never cut a connection in use");
    println!(
        "{} resumes, {} replays",
        s.reconnects(),
        donor.server.stats().replays.load(Ordering::Relaxed)
    );
}
