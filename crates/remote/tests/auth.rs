//! The handshake: the right key gets in, a wrong or missing key does not,
//! and an insecure donor is refused unless the client allows it.

mod common;

use common::Donor;
use memlend_remote::{ClientConfig, ClientError, Conn, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use memlend_wire::page::{Key, Status};

fn key(b: u8) -> Key {
    Key::from_bytes([b; 32])
}

#[test]
fn the_right_key_is_accepted_both_ways() {
    let donor = Donor::start(1024, Some(key(1)));
    let s = RemoteStore::open(donor.addr, ClientConfig::new(Some(key(1))), 16).unwrap();
    s.write(&[WriteOp { page: 3, data: &[5u8; PAGE_SIZE] }]).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    s.read(&mut [ReadOp { page: 3, buf: &mut buf }]).unwrap();
    assert!(buf.iter().all(|&b| b == 5));
}

#[test]
fn a_wrong_or_missing_key_is_refused_and_logged() {
    let donor = Donor::start(1024, Some(key(1)));
    let wrong = Conn::connect(donor.addr, &ClientConfig::new(Some(key(2)))).unwrap_err();
    assert!(matches!(wrong, ClientError::Refused(Status::AuthFailed)), "{wrong:?}");
    let mut none = ClientConfig::new(None);
    none.allow_insecure = true;
    let missing = Conn::connect(donor.addr, &none).unwrap_err();
    assert!(matches!(missing, ClientError::Refused(Status::AuthFailed)), "{missing:?}");
    // The server counts a refusal just after sending it; give it a moment.
    let failed =
        || donor.server.stats().handshakes_failed.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while failed() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(failed(), 2);
}

#[test]
fn an_insecure_donor_needs_the_clients_consent() {
    let donor = Donor::start(1024, None);
    let mut cfg = ClientConfig::new(Some(key(1)));
    let err = Conn::connect(donor.addr, &cfg).unwrap_err();
    assert!(matches!(err, ClientError::InsecureDonor), "{err:?}");
    cfg.allow_insecure = true;
    Conn::connect(donor.addr, &cfg).unwrap();
}
