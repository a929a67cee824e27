//! Round trips, every bit flip, every truncation, wrong keys, the replay
//! window.

use super::*;
use proptest::prelude::*;
use std::net::SocketAddr;

fn key() -> CtrlKey {
    CtrlKey::new(&[9; 32])
}

fn env(body: Body) -> Envelope {
    Envelope { cluster_id: 7, sender: 11, incarnation: 13, counter: 17, body }
}

fn enc(e: &Envelope) -> Vec<u8> {
    let mut buf = [0u8; DATAGRAM_BYTES_MAX];
    let n = encode(e, &key(), &mut buf).unwrap();
    buf[..n].to_vec()
}

fn arb_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
    ]
}

fn arb_body() -> impl Strategy<Value = Body> {
    let class =
        prop_oneof![Just(NodeClass::Neutral), Just(NodeClass::Server), Just(NodeClass::Client)];
    let reason = prop_oneof![
        Just(ReleaseReason::Done),
        Just(ReleaseReason::Revoked),
        Just(ReleaseReason::Unknown)
    ];
    let report = (any::<u64>(), any::<u64>(), any::<u32>())
        .prop_map(|(donor, lease_id, pages_per_s)| LeaseReport { donor, lease_id, pages_per_s });
    prop_oneof![
        (any::<u64>(), arb_addr(), any::<u32>()).prop_map(|(a, d, n)| Body::Offer(Offer {
            available_bytes: a,
            data_addr: d,
            next_offer_ms: n
        })),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(r, b, m)| Body::Request(Request {
            request_id: r,
            bytes: b,
            bytes_min: m
        })),
        (any::<u64>(), any::<u64>(), any::<u64>(), arb_addr(), any::<[u8; 16]>(), any::<u32>())
            .prop_map(|(r, l, b, d, c, a)| Body::Grant(Grant {
                request_id: r,
                lease_id: l,
                bytes: b,
                data_addr: d,
                credential: c,
                ack_within_ms: a
            })),
        (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(r, l, c)| Body::Ack(Ack {
            request_id: r,
            lease_id: l,
            confirm: c
        })),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(l, b, d)| Body::Reclaim(Reclaim {
            lease_id: l,
            bytes: b,
            deadline_ms: d
        })),
        (any::<u64>(), reason)
            .prop_map(|(l, reason)| Body::Release(Release { lease_id: l, reason })),
        (
            "[a-z0-9é-]{0,10}",
            class,
            any::<[u64; 5]>(),
            arb_addr(),
            proptest::collection::vec(report, 0..=HEARTBEAT_LEASES_MAX),
            "([a-z0-9/é-]{1,32})?",
            proptest::collection::vec(
                (any::<u64>(), arb_addr())
                    .prop_map(|(node, ctrl_addr)| PeerAddr { node, ctrl_addr }),
                0..=HEARTBEAT_PEERS_MAX
            )
        )
            .prop_map(
                |(name, class, m, data_addr, leases, domain, peers)| Body::Heartbeat(Heartbeat {
                    peers,
                    domain: truncate_utf8(domain, DOMAIN_BYTES_MAX),
                    name,
                    class,
                    total_bytes: m[0],
                    used_bytes: m[1],
                    lent_bytes: m[2],
                    borrowed_bytes: m[3],
                    available_bytes: m[4],
                    data_addr,
                    leases
                })
            ),
    ]
}

/// `s` cut at a character boundary to at most `limit` bytes.
fn truncate_utf8(mut s: String, limit: usize) -> String {
    while s.len() > limit {
        s.pop();
    }
    s
}

proptest! {
    #[test]
    fn every_message_round_trips(body in arb_body(), c in 1u64.., s in any::<u64>()) {
        let e = Envelope { cluster_id: s, sender: s ^ 1, incarnation: s.rotate_left(7), counter: c, body };
        let d = enc(&e);
        prop_assert!(d.len() <= DATAGRAM_BYTES_MAX);
        prop_assert_eq!(decode(&d, &key()).unwrap(), e);
    }

    #[test]
    fn garbage_never_panics(d in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let _ = decode(&d, &key());
    }
}

/// A server's heartbeat with no leases and no domain.
fn sample_heartbeat() -> Heartbeat {
    Heartbeat {
        name: "node-a".into(),
        class: NodeClass::Server,
        total_bytes: 1,
        used_bytes: 2,
        lent_bytes: 3,
        borrowed_bytes: 4,
        available_bytes: 5,
        data_addr: "10.0.0.1:7070".parse().unwrap(),
        leases: vec![],
        domain: String::new(),
        peers: vec![],
    }
}

#[test]
fn every_bit_flip_and_every_truncation_is_refused() {
    let leases = vec![LeaseReport { donor: 5, lease_id: 6, pages_per_s: 7 }];
    let hb = Heartbeat { leases, domain: "rack-1".into(), ..sample_heartbeat() };
    let d = enc(&env(Body::Heartbeat(hb)));
    for bit in 0..d.len() * 8 {
        let mut bad = d.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(decode(&bad, &key()).is_err(), "bit {bit} flipped and accepted");
    }
    for n in 0..d.len() {
        assert!(decode(&d[..n], &key()).is_err(), "truncated to {n} and accepted");
    }
    let mut long = d.clone();
    long.push(0);
    assert!(decode(&long, &key()).is_err());
}

#[test]
fn a_wrong_key_and_the_insecure_key_are_refused() {
    let d = enc(&env(Body::Release(Release { lease_id: 1, reason: ReleaseReason::Done })));
    assert_eq!(decode(&d, &CtrlKey::new(&[8; 32])), Err(CtrlError::BadMac));
    assert_eq!(decode(&d, &CtrlKey::insecure()), Err(CtrlError::BadMac));
    assert_ne!(cluster_id_from_key(&[1; 32]), cluster_id_from_key(&[2; 32]));
}

#[test]
fn signed_but_malformed_bodies_are_refused_by_field() {
    // A datagram with a valid MAC over a bad body: the body parser's checks.
    let sign = |mut d: Vec<u8>| {
        let n = d.len() - CTRL_MAC_BYTES;
        let mac = key().mac(&d[..n]);
        d[n..].copy_from_slice(&mac);
        d
    };
    let ack = enc(&env(Body::Ack(Ack { request_id: 1, lease_id: 2, confirm: true })));
    let mut bad = ack.clone();
    bad[CTRL_HEADER_BYTES + 16] = 2; // confirm must be 0 or 1
    assert_eq!(decode(&sign(bad), &key()), Err(CtrlError::BadField("confirm")));
    let mut bad = ack.clone();
    bad[5] = 99;
    assert_eq!(decode(&sign(bad), &key()), Err(CtrlError::UnknownType(99)));
    let mut bad = ack.clone();
    bad[40] += 1; // body_len says one more than there is
    assert!(matches!(decode(&sign(bad), &key()), Err(CtrlError::BodyLength { .. })));
    let mut bad = ack;
    bad[6] = 1;
    assert_eq!(decode(&sign(bad), &key()), Err(CtrlError::BadFlags(1)));
}

#[test]
fn encoding_refuses_what_decoding_would() {
    let mut buf = [0u8; DATAGRAM_BYTES_MAX];
    let long = Heartbeat {
        name: "x".repeat(NAME_BYTES_MAX + 1),
        class: NodeClass::Neutral,
        total_bytes: 0,
        used_bytes: 0,
        lent_bytes: 0,
        borrowed_bytes: 0,
        available_bytes: 0,
        data_addr: "0.0.0.0:0".parse().unwrap(),
        leases: vec![],
        domain: String::new(),
        peers: vec![],
    };
    let wide =
        Heartbeat { name: "n".into(), domain: "d".repeat(DOMAIN_BYTES_MAX + 1), ..long.clone() };
    assert!(encode(&env(Body::Heartbeat(long)), &key(), &mut buf).is_err());
    assert!(encode(&env(Body::Heartbeat(wide)), &key(), &mut buf).is_err());
    let peer = PeerAddr { node: 1, ctrl_addr: "10.0.0.2:7071".parse().unwrap() };
    let chatty = Heartbeat {
        name: "n".into(),
        peers: vec![peer; HEARTBEAT_PEERS_MAX + 1],
        ..sample_heartbeat()
    };
    assert!(encode(&env(Body::Heartbeat(chatty)), &key(), &mut buf).is_err());
    let mut e = env(Body::Ack(Ack { request_id: 1, lease_id: 1, confirm: false }));
    e.counter = 0;
    assert!(encode(&e, &key(), &mut buf).is_err());
}

#[test]
fn the_replay_window() {
    let mut g = ReplayGuard::new();
    assert_eq!(g.check_and_record(1, 5, 0), Err(ReplayError::ZeroCounter));
    g.check_and_record(1, 5, 10).unwrap();
    assert_eq!(g.check_and_record(1, 5, 10), Err(ReplayError::Duplicate(10)));
    g.check_and_record(1, 5, 8).unwrap(); // reordered, once
    assert_eq!(g.check_and_record(1, 5, 8), Err(ReplayError::Duplicate(8)));
    g.check_and_record(1, 5, 100).unwrap();
    assert!(matches!(g.check_and_record(1, 5, 36), Err(ReplayError::TooOld { .. })));
    g.check_and_record(1, 5, 37).unwrap();
    assert!(matches!(g.check_and_record(1, 4, 1000), Err(ReplayError::OldIncarnation { .. })));
    g.check_and_record(1, 6, 1).unwrap(); // restarted: counting from 1 again
    assert_eq!(g.check_and_record(1, 6, 1), Err(ReplayError::Duplicate(1)));
    g.check_and_record(2, 1, 1).unwrap(); // senders are independent
}

#[test]
fn the_sender_table_is_bounded() {
    let mut g = ReplayGuard::new();
    for s in 0..SENDERS_MAX as u64 + 10 {
        g.check_and_record(s, 1, 1).unwrap();
    }
    assert_eq!(g.senders(), SENDERS_MAX);
}

/// A heartbeat without a domain is byte for byte what the first version
/// sent (flags 0, no label), so nodes that predate domains still read it;
/// one with a domain sets FLAG_DOMAIN. A domain flag on another message, an
/// unknown flag, or an empty label under the flag are refused.
#[test]
fn the_domain_label_is_flagged_and_optional() {
    let plain = sample_heartbeat();
    let racked = Heartbeat { domain: "rack-7".into(), ..plain.clone() };
    let d0 = enc(&env(Body::Heartbeat(plain)));
    let d1 = enc(&env(Body::Heartbeat(racked.clone())));
    assert_eq!(&d0[6..8], &[0, 0]);
    assert_eq!(u16::from_le_bytes([d1[6], d1[7]]), FLAG_DOMAIN);
    assert_eq!(d1.len(), d0.len() + 1 + "rack-7".len());
    assert_eq!(decode(&d1, &key()).unwrap().body, Body::Heartbeat(racked));
    let sign = |mut d: Vec<u8>| {
        let n = d.len() - CTRL_MAC_BYTES;
        let mac = key().mac(&d[..n]);
        d[n..].copy_from_slice(&mac);
        d
    };
    let mut unknown = d1.clone();
    unknown[6] |= 4;
    assert_eq!(decode(&sign(unknown), &key()), Err(CtrlError::BadFlags(5)));
    let mut missing = d0.clone();
    missing[6] = 1; // flagged, but the body ends before a label
    assert_eq!(decode(&sign(missing), &key()), Err(CtrlError::Truncated("domain bytes")));
    let ack = enc(&env(Body::Ack(Ack { request_id: 1, lease_id: 2, confirm: true })));
    let mut flagged = ack;
    flagged[6] = 1;
    assert_eq!(decode(&sign(flagged), &key()), Err(CtrlError::BadFlags(1)));
}

/// Gossiped peers follow the domain label under FLAG_PEERS, which only a
/// heartbeat may carry; an empty or oversized list under the flag, or a
/// list cut short, is refused.
#[test]
fn gossiped_peers_are_flagged_and_bounded() {
    let sign = |mut d: Vec<u8>| {
        let n = d.len() - CTRL_MAC_BYTES;
        let mac = key().mac(&d[..n]);
        d[n..].copy_from_slice(&mac);
        d
    };
    let peers = vec![
        PeerAddr { node: 7, ctrl_addr: "10.0.0.2:7071".parse().unwrap() },
        PeerAddr { node: 9, ctrl_addr: "[fe80::1]:7071".parse().unwrap() },
    ];
    let both = Heartbeat { domain: "r1".into(), peers: peers.clone(), ..sample_heartbeat() };
    let d = enc(&env(Body::Heartbeat(both.clone())));
    assert_eq!(u16::from_le_bytes([d[6], d[7]]), FLAG_DOMAIN | FLAG_PEERS);
    assert_eq!(decode(&d, &key()).unwrap().body, Body::Heartbeat(both));
    let only = Heartbeat { peers, ..sample_heartbeat() };
    let d = enc(&env(Body::Heartbeat(only)));
    assert_eq!(u16::from_le_bytes([d[6], d[7]]), FLAG_PEERS);
    let plain = enc(&env(Body::Heartbeat(sample_heartbeat())));
    // The flag with no list after the body, or a list of none or too many.
    let mut bare = plain.clone();
    bare[6] = FLAG_PEERS as u8;
    assert_eq!(decode(&sign(bare), &key()), Err(CtrlError::Truncated("peers")));
    for count in [0u8, HEARTBEAT_PEERS_MAX as u8 + 1] {
        let n = plain.len() - CTRL_MAC_BYTES;
        let mut d = plain[..n].to_vec();
        d[6] = FLAG_PEERS as u8;
        d.push(count);
        d.extend_from_slice(&[0u8; CTRL_MAC_BYTES]);
        assert!(decode(&sign(d), &key()).is_err(), "{count} peers");
    }
    let ack = enc(&env(Body::Ack(Ack { request_id: 1, lease_id: 2, confirm: true })));
    let mut flagged = ack;
    flagged[6] = FLAG_PEERS as u8;
    assert_eq!(decode(&sign(flagged), &key()), Err(CtrlError::BadFlags(FLAG_PEERS.into())));
}
