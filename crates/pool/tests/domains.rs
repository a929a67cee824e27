//! Failure domains and avoided donors: a demand for a mirror's second copy
//! never lands on the donor of the first, and lands outside its domain
//! whenever a donor elsewhere has room.

mod sim;

use memlend_pool::engine::Event;
use memlend_pool::select::SelectorKind;
use memlend_wire::ctrl::{Body, NodeClass};
use sim::{config, status, Net, GIB, MIB};

/// Node ids in `sim::config`.
fn id(i: usize) -> u64 {
    100 + i as u64
}

/// Servers 0..servers in the given domains, then one client.
fn racked(domains: &[&str]) -> Net {
    racked_choosing(domains, SelectorKind::FirstCome)
}

fn racked_choosing(domains: &[&str], kind: SelectorKind) -> Net {
    let n = domains.len() + 1;
    let labels: Vec<String> = domains.iter().map(|d| d.to_string()).collect();
    let cfg = |i: usize| {
        let mut c = config(i);
        c.domain = labels.get(i).cloned().unwrap_or_default();
        c
    };
    let mut net = Net::with_selector(n, cfg, kind);
    for i in 0..domains.len() {
        net.set_status(i, status(NodeClass::Server, GIB));
    }
    net.set_status(n - 1, status(NodeClass::Client, 0));
    net.run_for(300_000);
    net
}

fn donors(net: &Net, client: usize, owner: u64) -> Vec<u64> {
    net.ready(client).into_iter().filter(|r| r.0 == owner).map(|r| r.1).collect()
}

#[test]
fn peers_learn_each_others_domains_from_heartbeats() {
    let net = racked(&["rack-a", "rack-b"]);
    let m = net.nodes[2].engine.members();
    assert_eq!(m.get(id(0)).unwrap().domain, "rack-a");
    assert_eq!(m.get(id(1)).unwrap().domain, "rack-b");
    assert_eq!(net.nodes[0].engine.members().get(id(2)).unwrap().domain, "");
}

#[test]
fn the_second_copy_goes_to_another_domain_whenever_one_has_room() {
    // Four servers, two racks. Whichever donor takes the first copy, the
    // second must come from the other rack, over many tries (the first-come
    // selector spreads requests by a hash of the request).
    for round in 0..12u64 {
        let mut net = racked(&["a", "a", "b", "b"]);
        let owner = 10 + round;
        // Burn request ids so the hash differs from round to round.
        for r in 0..round {
            net.want(4, 1_000 + r, MIB);
        }
        net.want(4, owner, 64 * MIB);
        net.run_for(300_000);
        let first = donors(&net, 4, owner);
        assert_eq!(first.len(), 1, "{first:?}");
        net.want_avoiding(4, owner + 100, 64 * MIB, &first);
        net.run_for(300_000);
        let second = donors(&net, 4, owner + 100);
        assert_eq!(second.len(), 1, "round {round}: {second:?}");
        let rack = |n: u64| if n <= id(1) { "a" } else { "b" };
        assert_ne!(rack(first[0]), rack(second[0]), "round {round}: {first:?} then {second:?}");
        net.assert_consistent();
    }
}

#[test]
fn with_one_domain_the_second_copy_still_avoids_the_first_donor() {
    let mut net = racked(&["a", "a"]);
    net.want(2, 1, 64 * MIB);
    net.run_for(300_000);
    let first = donors(&net, 2, 1);
    net.want_avoiding(2, 2, 64 * MIB, &first);
    net.run_for(300_000);
    let second = donors(&net, 2, 2);
    assert_eq!(second.len(), 1);
    assert_ne!(first, second, "same domain is allowed, the same donor never");
}

#[test]
fn when_only_the_avoided_donor_has_room_the_demand_is_unmet_and_nothing_strands() {
    let mut net = racked(&["a"]);
    net.want(1, 1, 64 * MIB);
    net.run_for(300_000);
    let first = donors(&net, 1, 1);
    assert_eq!(first, vec![id(0)]);
    net.want_avoiding(1, 2, 64 * MIB, &first);
    net.run_for(20_000_000);
    assert!(donors(&net, 1, 2).is_empty());
    assert_eq!(net.count_events(1, |e| matches!(e, Event::DemandUnmet { owner: 2, .. })), 1);
    assert_eq!(net.reserved_bytes(0), 64 * MIB, "only the first copy's lease is held");
    net.assert_consistent();
}

/// A broadcast request reaches the avoided donor too (servers that offer
/// nothing, heartbeats not yet heard): its grant is released at once.
#[test]
fn a_grant_from_an_avoided_donor_is_given_back() {
    let mut net = racked(&["a", "b"]);
    net.want_avoiding(2, 5, 64 * MIB, &[id(0)]);
    net.run_for(300_000);
    assert_eq!(donors(&net, 2, 5), vec![id(1)]);
    net.run_for(3_000_000);
    assert_eq!(net.reserved_bytes(0), 0, "node 0 holds nothing for the avoiding demand");
    let granted_by_0 =
        net.sent.iter().filter(|(_, from, b, _)| *from == 0 && matches!(b, Body::Grant(_))).count();
    let acked_to_0 = net.ready(2).iter().filter(|r| r.1 == id(0)).count();
    assert_eq!(acked_to_0, 0, "granted {granted_by_0} times, bound never");
    net.assert_consistent();
}

/// A leg that grows lease by lease stays in the domains it already uses, so
/// it does not spread over every rack and leave the other leg none apart.
/// Most-free waits the grant window for every grant and, the grants being
/// equal, would otherwise take whichever answered first.
#[test]
fn a_growing_leg_keeps_to_its_own_domains_while_they_have_room() {
    const RACKS: [&str; 6] = ["c", "b", "a", "a", "b", "c"];
    let rack = |n: u64| RACKS[(n - id(0)) as usize];
    for round in 0..8u64 {
        let mut net = racked_choosing(&RACKS, SelectorKind::MostFree);
        let (client, first, second) = (RACKS.len(), 10 + round, 100 + round);
        for r in 0..round {
            net.want(client, 1_000 + r, MIB); // other request hashes
        }
        net.want(client, first, 64 * MIB);
        net.run_for(300_000);
        let a = donors(&net, client, first);
        net.want_avoiding(client, second, 64 * MIB, &a);
        net.run_for(300_000);
        let b = donors(&net, client, second);
        assert_eq!(b.len(), 1, "round {round}");
        assert_ne!(rack(a[0]), rack(b[0]));
        for _ in 0..3 {
            net.want_avoiding(client, first, 64 * MIB, &b);
            net.run_for(300_000);
        }
        let grown = donors(&net, client, first);
        assert_eq!(grown.len(), 4, "round {round}: {grown:?}");
        assert!(
            grown.iter().all(|&d| rack(d) == rack(a[0])),
            "round {round}: the first copy spread over racks {:?}",
            grown.iter().map(|&d| rack(d)).collect::<Vec<_>>()
        );
        net.assert_consistent();
    }
}
