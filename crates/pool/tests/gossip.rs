//! Membership without broadcast: nodes that know only a seed find every
//! peer through the peers that summaries pass on, and borrow from servers
//! they were never told of directly.

mod sim;

use memlend_pool::members::PEERS_MAX;
use memlend_wire::ctrl::{Body, NodeClass};
use sim::{config, ctrl_addr, status, Net, GIB, MIB};

/// Node 0 is the only seed (neutral: it lends nothing), nodes 1..=servers
/// lend, the last node borrows.
fn seeded(servers: usize) -> Net {
    let n = servers + 2;
    let mut net = Net::with(n, |i| {
        let mut c = config(i);
        c.broadcast = false;
        c.seeds = if i == 0 { Vec::new() } else { vec![ctrl_addr(0)] };
        c
    });
    net.set_status(0, status(NodeClass::Neutral, 0));
    for i in 1..=servers {
        net.set_status(i, status(NodeClass::Server, GIB));
    }
    net.set_status(n - 1, status(NodeClass::Client, 0));
    net
}

#[test]
fn a_node_that_knows_only_a_seed_learns_every_peer() {
    let mut net = seeded(6);
    net.run_for(5_000_000);
    for i in 0..net.nodes.len() {
        let known = net.nodes[i].engine.members().len();
        assert_eq!(known, net.nodes.len() - 1, "node {i} knows {known} peers");
    }
    assert!(net.nodes.len() - 1 < PEERS_MAX);
    let gossiped = net
        .sent
        .iter()
        .filter(|(_, _, b, _)| matches!(b, Body::Heartbeat(h) if !h.peers.is_empty()));
    assert!(gossiped.count() > 0, "summaries passed peers on");
    assert!(net.sent.iter().all(|s| !s.3), "nothing was broadcast");
}

#[test]
fn a_borrower_that_knows_only_a_neutral_seed_gets_a_lease_from_a_server() {
    let mut net = seeded(4);
    net.run_for(3_000_000);
    let client = net.nodes.len() - 1;
    net.want(client, 1, 64 * MIB);
    net.run_for(1_000_000);
    let ready = net.ready(client);
    assert_eq!(ready.len(), 1, "{ready:?}");
    assert_ne!(ready[0].1, 100, "not from the seed, which lends nothing");
    net.assert_consistent();
}

#[test]
fn on_a_lan_heartbeats_carry_no_peers() {
    let mut net = Net::new(4);
    net.set_status(0, status(NodeClass::Server, GIB));
    net.run_for(3_000_000);
    let any =
        net.sent.iter().any(|(_, _, b, _)| matches!(b, Body::Heartbeat(h) if !h.peers.is_empty()));
    assert!(!any, "broadcast needs no gossip, and its bytes stay as before");
}
