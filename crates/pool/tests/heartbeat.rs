//! Heartbeats between lease partners and summaries to the cluster
//! (`engine/heartbeat.rs`, `engine/summary.rs`): a steady node stops
//! telling everyone, its lease partner still hears it every period, a
//! silent donor is found within `dead_ms`, new room is told at once and
//! room lent out to whoever asks.

mod sim;

use memlend_pool::engine::{Config, Event};
use memlend_wire::ctrl::{Body, NodeClass};
use sim::{status, Net, GIB, MIB};

/// Heartbeats every 100 ms; one summary a second cluster-wide, so with two
/// peers each node refreshes every 2 s (±20%).
fn quiet(i: usize) -> Config {
    let mut c = sim::config(i);
    c.summaries_per_s = 1;
    c
}

/// A lends, B borrows 256 MiB from it, C is neutral; steady.
fn leased() -> Net {
    let mut net = Net::with(3, quiet);
    net.set_status(0, status(NodeClass::Server, GIB));
    net.set_status(1, status(NodeClass::Client, 0));
    net.set_status(2, status(NodeClass::Neutral, 0));
    net.run_for(300_000);
    net.want(1, 1, 256 * MIB);
    net.run_for(300_000);
    assert_eq!(net.ready(1).len(), 1);
    net
}

/// Heartbeats `from` sent since `since_us`: (broadcast, unicast).
fn heartbeats(net: &Net, from: usize, since_us: u64) -> (usize, usize) {
    let hbs = net
        .sent
        .iter()
        .filter(|(t, f, b, _)| *t >= since_us && *f == from && matches!(b, Body::Heartbeat(_)));
    let (bc, uni): (Vec<_>, Vec<_>) = hbs.partition(|(_, _, _, bc)| *bc);
    (bc.len(), uni.len())
}

#[test]
fn a_steady_node_stops_broadcasting_but_its_lease_partner_hears_it_every_period() {
    let mut net = leased();
    let since = net.now_us;
    net.run_for(3_000_000);
    for node in [0, 1] {
        let (bc, uni) = heartbeats(&net, node, since);
        // Every 100 ms to the one partner; to everyone at the 2 s refresh.
        assert!(uni >= 28, "node {node}: {uni} heartbeats to its partner");
        assert!(bc <= 2, "node {node}: {bc} summaries in 3 s");
    }
    let (bc, uni) = heartbeats(&net, 2, since);
    assert_eq!(uni, 0, "the neutral node has no partner");
    assert!(bc <= 2, "{bc}");
    // Lease reports go to the donor only, never to everyone.
    for (_, from, body, bc) in &net.sent {
        if let (1, Body::Heartbeat(hb)) = (*from, body) {
            assert!(!*bc || hb.leases.is_empty(), "a summary carries no lease report");
        }
    }
    let lent: Vec<_> = net.nodes[0].engine.lent().collect();
    assert!(net.now_us - lent[0].reported_us <= 200_000, "reported every period");
    net.assert_consistent();
}

#[test]
fn a_silent_donor_is_detected_within_the_partner_bound() {
    let mut net = leased();
    net.crash(0);
    net.run_for(3_300_000); // dead_ms is 3 s
    assert_eq!(net.count_events(1, |e| matches!(e, Event::LeaseLost { owner: 1, .. })), 1);
    assert_eq!(net.borrowed_bytes(1), 0);
    // The neutral node, no partner of A, still lists it: it expects only
    // A's slow refresh (four periods of up to 2.4 s).
    assert!(net.nodes[2].engine.members().get(100).is_some());
    net.run_for(12_000_000);
    assert!(net.nodes[2].engine.members().get(100).is_none(), "gone after its far timeout");
}

#[test]
fn a_silent_borrower_frees_its_lease_within_the_partner_bound() {
    let mut net = leased();
    net.crash(1);
    net.run_for(3_300_000);
    assert_eq!(net.reserved_bytes(0), 0, "the dead borrower's lease is freed");
}

#[test]
fn new_room_is_told_at_once_room_lent_out_to_whoever_asks() {
    let mut net = Net::with(3, quiet);
    net.set_status(2, status(NodeClass::Client, 0));
    net.run_for(3_000_000); // first summaries out, refreshes slow
    let since = net.now_us;
    net.set_status(0, status(NodeClass::Server, GIB));
    assert_eq!(heartbeats(&net, 0, since), (1, 0), "a server with room says so at once");
    net.run_for(1_000); // delivered
    let a = net.nodes[2].engine.members().get(100).unwrap();
    assert_eq!((a.class, a.available_bytes), (NodeClass::Server, GIB));
    // C takes all of it: the bystander B is not told...
    net.want(2, 1, GIB);
    net.run_for(300_000);
    assert_eq!(net.ready(2).len(), 1);
    assert_eq!(net.nodes[1].engine.members().get(100).unwrap().available_bytes, GIB);
    // ...until it asks: A answers with its state, not with silence.
    net.set_status(1, status(NodeClass::Client, 0));
    net.want(1, 1, 256 * MIB);
    net.run_for(1_000);
    assert_eq!(net.nodes[1].engine.members().get(100).unwrap().available_bytes, 0);
    // No longer a server: everyone is told at once.
    let since = net.now_us;
    net.set_status(0, status(NodeClass::Neutral, 0));
    assert_eq!(heartbeats(&net, 0, since).0, 1);
    net.run_for(1_000);
    assert_eq!(net.nodes[1].engine.members().get(100).unwrap().class, NodeClass::Neutral);
}

#[test]
fn a_server_greets_a_node_that_restarts() {
    let mut net = leased();
    net.run_for(3_000_000);
    net.crash(2);
    net.run_for(100_000);
    net.restart(2);
    net.run_for(10_000);
    // C's boot summary reached A, which answered at once: C knows a server
    // with room long before A's next refresh.
    let a = net.nodes[2].engine.members().get(100).map(|p| p.class);
    assert_eq!(a, Some(NodeClass::Server));
}
