use super::*;
use memlend_pool::api::{self, Ask, LeaseGrant};
use memlend_store::ram::{RamOptions, RamStore};
use std::io::BufReader;
use std::os::unix::net::UnixListener;

/// A grant that arrives when no ask waits for it (its ask timed out while
/// the daemon kept retrying) is given back, not held until the exit.
#[test]
fn a_late_grant_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let client = Client::connect(&path).unwrap();
    let (daemon, _) = listener.accept().unwrap();
    daemon.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (tx, rx) = channel();
    let first: Arc<dyn PageStore> = Arc::new(RamStore::new(8, RamOptions::default()).unwrap());
    let h = Handoff {
        client,
        members: Vec::new(),
        cfg: ClientConfig::new(None),
        encrypt: false,
        home: None,
        backed: false,
        mirrored: false,
        segments: 1,
        copies: Copies::default(),
    };
    spawn(h, tx, rx, first).unwrap();
    let grant = LeaseGrant {
        donor: 7,
        donor_name: "d".into(),
        donor_domain: String::new(),
        lease: 42,
        bytes: 1 << 20,
        data_addr: "127.0.0.1:1".parse().unwrap(),
        credential: "00".repeat(16),
    };
    let mut w = daemon.try_clone().unwrap();
    api::write_json(&mut w, &Tell::Lease(grant)).unwrap();
    let mut r = BufReader::new(daemon);
    let line = api::read_line(&mut r).unwrap().expect("an answer");
    let ask: Ask = serde_json::from_str(&line).unwrap();
    assert_eq!(ask, Ask::Release { donor: 7, lease: 42 });
}
