//! Sealed slabs: the donor keeps a 16-byte sidecar beside every page, and
//! `crypt` over such a slab keeps its tags there, so the borrower holds only
//! a version a page. Against a real page server.

mod common;

use common::{page_pattern, Donor, Proxy};
use memlend_remote::{ClientConfig, Conn, RemoteStore};
use memlend_store::layer::Crypt;
use memlend_store::{PageStore, ReadOp, Sidecar, SidecarStore, StoreError, WriteOp, PAGE_SIZE};
use memlend_wire::page::{Opcode, ReqHeader, Status, FLAG_SEALED};

fn insecure() -> ClientConfig {
    ClientConfig::new(None)
}

fn side_of(seed: u8, page: u64) -> Sidecar {
    let mut s = [seed; 16];
    s[..8].copy_from_slice(&page.to_le_bytes());
    s
}

fn write_sealed(s: &RemoteStore, seed: u8, page: u64, count: u64) {
    let data: Vec<u8> = (page..page + count).flat_map(|p| page_pattern(seed, p)).collect();
    let side: Vec<Sidecar> = (page..page + count).map(|p| side_of(seed, p)).collect();
    s.write_with(&[WriteOp { page, data: &data }], &side).unwrap();
}

fn check_sealed(s: &RemoteStore, seed: u8, page: u64, count: u64) {
    let mut buf = vec![0u8; count as usize * PAGE_SIZE];
    let mut side = vec![[0xee; 16]; count as usize];
    s.read_with(&mut [ReadOp { page, buf: &mut buf }], &mut side).unwrap();
    for (i, (got, got_side)) in buf.chunks(PAGE_SIZE).zip(&side).enumerate() {
        let p = page + i as u64;
        assert!(got == page_pattern(seed, p), "page {p} differs");
        assert_eq!(*got_side, side_of(seed, p), "sidecar of page {p}");
    }
}

#[test]
fn sidecars_travel_with_their_pages_across_split_batches() {
    let donor = Donor::start(8192, None);
    let s = RemoteStore::open_sealed(donor.addr, insecure(), 4096).unwrap();
    // 1000 pages is four requests (256 a request): each carries its share.
    write_sealed(&s, 1, 100, 1000);
    check_sealed(&s, 1, 100, 1000);
    check_sealed(&s, 1, 555, 3);
    // Two runs in one batch.
    let (mut a, mut b) = (vec![0u8; PAGE_SIZE], vec![0u8; 2 * PAGE_SIZE]);
    let mut side = [[0u8; 16]; 3];
    let mut ops = [ReadOp { page: 100, buf: &mut a }, ReadOp { page: 700, buf: &mut b }];
    s.read_with(&mut ops, &mut side).unwrap();
    assert_eq!(side, [side_of(1, 100), side_of(1, 700), side_of(1, 701)]);
    // Never written: zero page, zero sidecar.
    let mut z = vec![1u8; PAGE_SIZE];
    let mut zs = [[1u8; 16]];
    s.read_with(&mut [ReadOp { page: 4000, buf: &mut z }], &mut zs).unwrap();
    assert!(z.iter().all(|&x| x == 0) && zs[0] == [0; 16]);
    // A plain write to a sealed slab works; its sidecar reads zero.
    s.write(&[WriteOp { page: 100, data: &page_pattern(9, 100) }]).unwrap();
    let mut p = vec![0u8; PAGE_SIZE];
    s.read_with(&mut [ReadOp { page: 100, buf: &mut p }], &mut zs).unwrap();
    assert_eq!((p, zs[0]), (page_pattern(9, 100), [0; 16]));
}

#[test]
fn a_plain_slab_refuses_sealed_requests() {
    let donor = Donor::start(1000, None);
    let s = RemoteStore::open(donor.addr, insecure(), 100).unwrap();
    let err = s.write_with(&[WriteOp { page: 0, data: &[1; PAGE_SIZE] }], &[[0; 16]]).unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    // The donor refuses too, for a client that asks anyway.
    let mut conn = Conn::connect(donor.addr, &insecure()).unwrap();
    let open = ReqHeader { page: 10, ..ReqHeader::new(Opcode::OpenSlab, 0) };
    let slab = conn.call(open, &[], None).unwrap().value as u32;
    let read = ReqHeader { slab, count: 1, flags: FLAG_SEALED, ..ReqHeader::new(Opcode::Read, 0) };
    let err = conn.call(read, &[], None).unwrap_err();
    assert!(err.to_string().contains("BadFlags"), "{err}");
    // The connection is still in step.
    let ping = conn.call(ReqHeader::new(Opcode::Ping, 0), &[], None).unwrap();
    assert_eq!(ping.status, Status::Ok);
}

#[test]
fn sealed_writes_survive_a_cut_connection_exactly_once() {
    let donor = Donor::start(4096, None);
    let proxy = Proxy::start(donor.addr);
    let s = RemoteStore::open_sealed(proxy.addr, insecure(), 1024).unwrap();
    write_sealed(&s, 3, 0, 512);
    proxy.cut();
    check_sealed(&s, 3, 0, 512);
    write_sealed(&s, 4, 512, 512);
    proxy.cut();
    check_sealed(&s, 4, 512, 512);
    check_sealed(&s, 3, 0, 512);
    assert_eq!(s.reconnects(), 2);
}

/// `crypt` over a sealed slab: the donor holds ciphertext and tags, the
/// pages read back, and a donor that hands back an older page with its
/// own valid tag (a rollback) is caught.
#[test]
fn crypt_over_a_sealed_slab_round_trips_and_catches_a_rollback() {
    let donor = Donor::start(1000, None);
    let slab = RemoteStore::open_sealed(donor.addr, insecure(), 64).unwrap();
    let crypt = Crypt::new(slab, [3; 32]).unwrap();
    let data: Vec<u8> = (0..8).flat_map(|p| page_pattern(5, p)).collect();
    crypt.write(&[WriteOp { page: 0, data: &data }]).unwrap();
    let mut back = vec![0u8; data.len()];
    crypt.read(&mut [ReadOp { page: 0, buf: &mut back }]).unwrap();
    assert_eq!(back, data);
    let (mut old, mut old_side) = (vec![0u8; PAGE_SIZE], [[0u8; 16]]);
    crypt.inner().read_with(&mut [ReadOp { page: 2, buf: &mut old }], &mut old_side).unwrap();
    assert_ne!(old, page_pattern(5, 2), "the donor holds ciphertext");
    crypt.write(&[WriteOp { page: 2, data: &page_pattern(6, 2) }]).unwrap();
    crypt.inner().write_with(&[WriteOp { page: 2, data: &old }], &old_side).unwrap();
    let mut p = vec![0u8; PAGE_SIZE];
    let err = crypt.read(&mut [ReadOp { page: 2, buf: &mut p }]).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { page: 2, .. }), "{err}");
    assert_eq!(crypt.corrupt_pages(), 1);
    assert_eq!(crypt.metadata_bytes(), 64 * 6);
}

/// Protocol version 2: a sealed READ's payload CRC covers its sidecars
/// only, since the borrower checks each page against its tag; a plain
/// READ's covers its pages.
#[test]
fn a_sealed_reads_crc_covers_its_sidecars_only() {
    use memlend_remote::Dest;
    use memlend_wire::page;
    let donor = Donor::start(1000, None);
    let mut conn = Conn::connect(donor.addr, &insecure()).unwrap();
    let open = ReqHeader { page: 64, flags: FLAG_SEALED, ..ReqHeader::new(Opcode::OpenSlab, 0) };
    let slab = conn.call(open, &[], None).unwrap().value as u32;
    let data: Vec<u8> = (0..2).flat_map(|p| page_pattern(7, p)).collect();
    let side: Vec<u8> = (0..2).flat_map(|p| side_of(7, p)).collect();
    let write =
        ReqHeader { slab, count: 2, flags: FLAG_SEALED, ..ReqHeader::new(Opcode::Write, 0) };
    conn.call(write, &[&side, &data], None).unwrap();
    let (mut pages, mut tags) = (vec![0u8; 2 * PAGE_SIZE], vec![0u8; 32]);
    for sealed in [true, false] {
        let read =
            ReqHeader { slab, count: 2, flags: FLAG_SEALED, ..ReqHeader::new(Opcode::Read, 0) };
        conn.queue(read, &[]);
        conn.send().unwrap();
        let got = conn.recv(|_| Some(Dest { head: &mut tags, data: &mut pages, sealed }));
        match sealed {
            true => {
                let h = got.unwrap();
                assert_eq!(h.payload_crc, page::payload_crc(&side));
                assert!(pages == data && tags == side);
            }
            false => assert!(got.unwrap_err().to_string().contains("BadPayloadCrc")),
        }
    }
    let plain = ReqHeader { page: 8, ..ReqHeader::new(Opcode::OpenSlab, 0) };
    let slab = conn.call(plain, &[], None).unwrap().value as u32;
    let write = ReqHeader { slab, count: 2, ..ReqHeader::new(Opcode::Write, 0) };
    conn.call(write, &[&data], None).unwrap();
    let read = ReqHeader { slab, count: 2, ..ReqHeader::new(Opcode::Read, 0) };
    let h = conn.call(read, &[], Some(&mut pages)).unwrap();
    assert_eq!(h.payload_crc, page::payload_crc(&data));
}
