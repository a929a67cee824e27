//! Bad input to the page server: each bad frame gets an error reply or a
//! closed connection, and a well-behaved borrower keeps its pages intact.

mod common;

use common::{page_pattern, Donor};
use memlend_remote::{ClientConfig, ClientError, Conn, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use memlend_wire::page::{self, Opcode, RepHeader, ReqHeader, Status, FATAL_TAG};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A borrower that writes 64 pages first and checks them after each attack.
struct Witness {
    store: RemoteStore,
}

impl Witness {
    fn new(donor: &Donor) -> Self {
        let store = RemoteStore::open(donor.addr, ClientConfig::new(None), 64).unwrap();
        let data: Vec<u8> = (0..64).flat_map(|p| page_pattern(42, p)).collect();
        store.write(&[WriteOp { page: 0, data: &data }]).unwrap();
        Witness { store }
    }

    fn check(&self) {
        let mut buf = vec![0u8; 64 * PAGE_SIZE];
        self.store.read(&mut [ReadOp { page: 0, buf: &mut buf }]).unwrap();
        for (p, got) in buf.chunks(PAGE_SIZE).enumerate() {
            assert!(got == page_pattern(42, p as u64), "witness page {p} changed");
        }
    }
}

/// A connection past the handshake, speaking raw bytes.
fn raw(donor: &Donor) -> (Conn, TcpStream) {
    let cfg = ClientConfig::new(None);
    // Handshake with a Conn, then take its socket over for raw frames.
    let conn = Conn::connect(donor.addr, &cfg).unwrap();
    let stream = conn_stream(&conn);
    (conn, stream)
}

fn conn_stream(conn: &Conn) -> TcpStream {
    conn.try_clone_stream().unwrap()
}

fn read_reply(s: &mut TcpStream) -> Option<RepHeader> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; page::REP_HEADER_LEN];
    s.read_exact(&mut b).ok()?;
    Some(RepHeader::decode(&b).unwrap())
}

fn assert_closed(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "connection should be closed");
}

fn frame(h: ReqHeader, payload: &[u8]) -> Vec<u8> {
    let h = ReqHeader {
        payload_len: payload.len() as u32,
        payload_crc: if payload.is_empty() { 0 } else { page::payload_crc(payload) },
        ..h
    };
    [&h.encode()[..], payload].concat()
}

#[test]
fn fatal_frames_close_only_their_connection() {
    let donor = Donor::start(4096, None);
    let w = Witness::new(&donor);
    let mut attacks: Vec<(&str, Vec<u8>, Status)> = vec![
        ("random bytes", (0..200u8).map(|i| i.wrapping_mul(37)).collect(), Status::BadMagic),
        (
            "oversize payload",
            frame_with_len(page::limits::PAYLOAD_BYTES_MAX + 1),
            Status::BadLength,
        ),
    ];
    let mut bad_crc = frame(ReqHeader::new(Opcode::Ping, 1), &[]);
    bad_crc[12] ^= 0xff;
    attacks.push(("header CRC", bad_crc, Status::BadHeaderCrc));
    for (what, bytes, status) in attacks {
        let (_conn, mut s) = raw(&donor);
        s.write_all(&bytes).unwrap();
        let r = read_reply(&mut s).unwrap_or_else(|| panic!("{what}: no reply"));
        assert_eq!((r.status, r.tag), (status, FATAL_TAG), "{what}");
        assert_closed(&mut s);
        w.check();
    }
}

fn frame_with_len(len: u32) -> Vec<u8> {
    let h = ReqHeader { payload_len: len, ..ReqHeader::new(Opcode::Write, 1) };
    h.encode().to_vec()
}

#[test]
fn recoverable_errors_keep_the_connection() {
    let donor = Donor::start(4096, None);
    let w = Witness::new(&donor);
    let (_conn, mut s) = raw(&donor);
    let open = ReqHeader { page: 16, ..ReqHeader::new(Opcode::OpenSlab, 1) };
    s.write_all(&frame(open, &[])).unwrap();
    let slab = read_reply(&mut s).unwrap().value as u32;
    let page4k = vec![7u8; PAGE_SIZE];

    let cases: Vec<(&str, Vec<u8>, Status)> = vec![
        ("unknown opcode", frame(ReqHeader::new(Opcode::Ping, 2), &[]), Status::Ok),
        (
            "unknown opcode",
            frame(ReqHeader { opcode: 99, ..ReqHeader::new(Opcode::Ping, 3) }, &[]),
            Status::UnknownOpcode,
        ),
        (
            "out of range",
            frame(ReqHeader { slab, page: 16, count: 1, ..ReqHeader::new(Opcode::Read, 4) }, &[]),
            Status::OutOfRange,
        ),
        (
            "page overflow",
            frame(
                ReqHeader { slab, page: u64::MAX, count: 2, ..ReqHeader::new(Opcode::Discard, 5) },
                &[],
            ),
            Status::OutOfRange,
        ),
        (
            "batch too large",
            frame(ReqHeader { slab, count: 257, ..ReqHeader::new(Opcode::Read, 6) }, &[]),
            Status::BatchTooLarge,
        ),
        (
            "length mismatch",
            frame(ReqHeader { slab, count: 2, ..ReqHeader::new(Opcode::Write, 7) }, &page4k),
            Status::BadLength,
        ),
        (
            "someone else's slab",
            frame(
                ReqHeader { slab: slab + 1000, count: 1, ..ReqHeader::new(Opcode::Read, 8) },
                &[],
            ),
            Status::NoSuchSlab,
        ),
        (
            "reserved flags",
            frame(ReqHeader { flags: 1, ..ReqHeader::new(Opcode::Ping, 9) }, &[]),
            Status::BadFlags,
        ),
        ("zero-size slab", frame(ReqHeader::new(Opcode::OpenSlab, 10), &[]), Status::BadLength),
        (
            "slab beyond budget",
            frame(ReqHeader { page: 1 << 40, ..ReqHeader::new(Opcode::OpenSlab, 11) }, &[]),
            Status::NoSpace,
        ),
    ];
    for (what, bytes, status) in cases {
        s.write_all(&bytes).unwrap();
        let r = read_reply(&mut s).unwrap_or_else(|| panic!("{what}: connection dropped"));
        assert_eq!(r.status, status, "{what}");
    }
    // A corrupted payload is refused and nothing is written.
    let mut f = frame(ReqHeader { slab, count: 1, ..ReqHeader::new(Opcode::Write, 12) }, &page4k);
    *f.last_mut().unwrap() ^= 1;
    s.write_all(&f).unwrap();
    assert_eq!(read_reply(&mut s).unwrap().status, Status::BadPayloadCrc);
    s.write_all(&frame(ReqHeader { slab, count: 1, ..ReqHeader::new(Opcode::Read, 13) }, &[]))
        .unwrap();
    let r = read_reply(&mut s).unwrap();
    assert_eq!((r.status, r.payload_len), (Status::Ok, PAGE_SIZE as u32));
    let mut body = vec![1u8; PAGE_SIZE];
    s.read_exact(&mut body).unwrap();
    assert!(body.iter().all(|&b| b == 0), "the corrupt write did not land");
    w.check();
}

#[test]
fn a_client_that_vanishes_mid_request_harms_nobody() {
    let donor = Donor::start(4096, None);
    let w = Witness::new(&donor);
    for cut_at in [10, 47, 48, 1000] {
        let (_conn, mut s) = raw(&donor);
        let f = frame(
            ReqHeader { slab: 1, count: 1, ..ReqHeader::new(Opcode::Write, 1) },
            &[9u8; PAGE_SIZE],
        );
        s.write_all(&f[..cut_at]).unwrap();
        drop(s);
        drop(_conn);
    }
    // Garbage before any handshake.
    let mut s = TcpStream::connect(donor.addr).unwrap();
    s.write_all(&[0xffu8; 100]).unwrap();
    assert_closed(&mut s);
    w.check();
}

#[test]
fn another_borrower_cannot_name_my_slab() {
    let donor = Donor::start(4096, None);
    let w = Witness::new(&donor);
    let mut other = Conn::connect(donor.addr, &ClientConfig::new(None)).unwrap();
    let slab = w.store.slab();
    for op in [Opcode::Read, Opcode::Discard, Opcode::CloseSlab, Opcode::SlabInfo] {
        let h = ReqHeader { slab, count: 1, ..ReqHeader::new(op, 0) };
        let mut buf = vec![0u8; PAGE_SIZE];
        let r = other.call(h, &[], Some(&mut buf));
        assert!(matches!(r, Err(ClientError::Status(Status::NoSuchSlab))), "{op:?}: {r:?}");
    }
    let h = ReqHeader { slab, count: 1, ..ReqHeader::new(Opcode::Write, 0) };
    let r = other.call(h, &[&[1u8; PAGE_SIZE]], None);
    assert!(matches!(r, Err(ClientError::Status(Status::NoSuchSlab))), "{r:?}");
    w.check();
}
