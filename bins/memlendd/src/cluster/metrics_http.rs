//! `--metrics ADDR`: OpenMetrics text (through `prometheus-client`) over a
//! minimal HTTP/1.0 responder. Each scrape asks the control loop for a
//! snapshot (it owns the engine), and reads the live files of the processes
//! borrowing on this node (`memlend_node::live`), so that one scrape sees
//! the node and every `memlend run` process on it.

use super::wake::Waker;
use memlend_node::live::Proc;
use memlend_pool::api::ClusterStatus;
use memlend_server::lifecycle::{poll_accept, Shutdown};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};
use prometheus_client::registry::Registry;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::Duration;

pub fn serve(
    listener: TcpListener,
    ask: SyncSender<SyncSender<ClusterStatus>>,
    waker: Waker,
    shutdown: Shutdown,
) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "cannot serve metrics");
        return;
    }
    let accept = || listener.accept().map(|(s, _)| s);
    poll_accept("metrics", &shutdown, accept, |mut s| {
        if s.set_nonblocking(false).is_err() {
            return;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        let mut req = [0u8; 1024];
        let _ = s.read(&mut req); // the request itself does not matter
        let (tx, rx) = sync_channel(1);
        if ask.try_send(tx).is_err() {
            return;
        }
        waker.wake();
        let body = match rx.recv_timeout(Duration::from_secs(2)) {
            Ok(st) => render(&st, &memlend_node::live::read_all(false)),
            Err(_) => return,
        };
        let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        let _ = write!(
            s,
            "HTTP/1.0 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    });
}

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn gauge(r: &mut Registry, name: &str, help: &str, value: u64) {
    let g: Gauge = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    r.register(name, help, g);
}

/// A counter's value as the engine counted it (OpenMetrics adds `_total`).
fn counter(r: &mut Registry, name: &str, help: &str, value: u64) {
    let c: Counter = Counter::default();
    c.inc_by(value);
    r.register(name, help, c);
}

fn gauges(
    r: &mut Registry,
    name: &str,
    help: &str,
    items: impl IntoIterator<Item = (Labels, f64)>,
) {
    let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for (l, v) in items {
        f.get_or_create(&l).set(v);
    }
    r.register(name, help, f);
}

fn counters(
    r: &mut Registry,
    name: &str,
    help: &str,
    items: impl IntoIterator<Item = (Labels, u64)>,
) {
    let f = Family::<Labels, Counter>::default();
    for (l, v) in items {
        f.get_or_create(&l).inc_by(v);
    }
    r.register(name, help, f);
}

fn render(st: &ClusterStatus, procs: &[Proc]) -> String {
    let mut r = Registry::with_prefix("memlend");
    node(&mut r, st);
    processes(&mut r, procs);
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &r) {
        tracing::warn!(error = %e, "cannot encode metrics");
    }
    text
}

fn node(r: &mut Registry, st: &ClusterStatus) {
    let n = &st.node;
    let class = ["neutral", "server", "client"]
        .map(|c| (labels(&[("class", c)]), f64::from(u8::from(n.class == c))));
    gauges(r, "node_class", "1 for this node's ACMS class", class);
    gauge(r, "memory_total_bytes", "memory of the node (or its cgroup)", n.total_bytes);
    gauge(r, "memory_used_bytes", "memory in use on the node", n.used_bytes);
    gauge(r, "lent_bytes", "memory lent to other nodes", n.lent_bytes);
    gauge(r, "borrowed_bytes", "memory borrowed from other nodes", n.borrowed_bytes);
    gauge(r, "leases_lent", "leases this node lends", st.lent.len() as u64);
    gauge(r, "leases_borrowed", "leases this node borrows", st.borrowed.len() as u64);
    gauge(r, "peers", "peers known", st.peers.len() as u64);
    gauge(r, "unmet_demand_bytes", "wanted and not yet granted", st.unmet_bytes);
    let by = |key: &str, v: &[(String, u64)]| -> Vec<(Labels, u64)> {
        v.iter().map(|(k, n)| (labels(&[(key, k)]), *n)).collect()
    };
    counters(r, "messages_sent", "control messages sent, by type", by("type", &st.sent));
    counters(
        r,
        "messages_received",
        "control messages received, by type",
        by("type", &st.received),
    );
    counters(
        r,
        "datagrams",
        "datagrams sent, received and dropped (by why)",
        by("what", &st.datagrams),
    );
    for (what, v) in &st.counters {
        counter(r, what, "protocol events (docs/control.md)", *v);
    }
    counter(r, "handshakes", "requests that ended in a confirmed lease", st.handshakes);
    let latency = [("50", st.handshake_us_p50), ("99", st.handshake_us_p99)]
        .into_iter()
        .filter_map(|(p, us)| Some((labels(&[("percentile", p)]), us? as f64 / 1e6)));
    gauges(r, "handshake_latency_seconds", "request to confirmed lease", latency);
}

/// Per process: labelled by pid and the program's name (its argv[0]'s
/// last part), which keeps the label set small.
fn processes(r: &mut Registry, procs: &[Proc]) {
    let who = |p: &Proc| -> Vec<(String, String)> {
        let argv0 = p.command.split_whitespace().next().unwrap_or("");
        let name = argv0.rsplit('/').next().unwrap_or(argv0);
        labels(&[("pid", &p.pid.to_string()), ("program", name)])
    };
    let with = |p: &Proc, k: &str, v: &str| -> Labels {
        let mut l = who(p);
        l.push((k.into(), v.into()));
        l
    };
    let faults = procs.iter().flat_map(|p| {
        [
            ("store", p.faults_from_store),
            ("pool", p.faults_from_pool),
            ("zero", p.faults_zero_filled),
        ]
        .map(|(source, n)| (with(p, "source", source), n))
    });
    counters(
        r,
        "process_faults",
        "far-memory faults served, by source",
        faults.collect::<Vec<_>>(),
    );
    let bytes = |f: fn(&Proc) -> u64| -> Vec<(Labels, f64)> {
        procs.iter().map(|p| (who(p), f(p) as f64)).collect()
    };
    gauges(r, "process_rss_bytes", "the whole process's resident set", bytes(|p| p.rss_bytes));
    gauges(r, "process_far_resident_bytes", "far pages resident", bytes(|p| p.resident_far_bytes));
    gauges(
        r,
        "process_far_budget_bytes",
        "the far region's local budget",
        bytes(|p| p.budget_bytes),
    );
    gauges(r, "process_far_bytes", "far memory allocated", bytes(|p| p.far_bytes));
    gauges(r, "process_pool_pages", "pages in the compressed pool", bytes(|p| p.pool_pages));
    let latency = procs.iter().flat_map(|p| {
        [("50", p.miss_us_p50), ("99", p.miss_us_p99), ("99.9", p.miss_us_p999)]
            .map(|(pct, us)| (with(p, "percentile", pct), us / 1e6))
    });
    let help = "store fault to wake, since the process started";
    gauges(r, "process_miss_latency_seconds", help, latency.collect::<Vec<_>>());
    let prefetch = procs.iter().flat_map(|p| {
        [("hit", p.prefetch_hits), ("wasted", p.prefetch_wasted)]
            .map(|(outcome, n)| (with(p, "outcome", outcome), n))
    });
    counters(
        r,
        "process_prefetch_pages",
        "prefetched pages, used or not",
        prefetch.collect::<Vec<_>>(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use memlend_pool::api::NodeView;

    #[test]
    fn a_scrape_names_the_node_and_each_process() {
        let node = NodeView {
            id: 1,
            name: "a".into(),
            class: "server".into(),
            total_bytes: 8 << 30,
            used_bytes: 1 << 30,
            lent_bytes: 2 << 30,
            borrowed_bytes: 0,
            available_bytes: 0,
            alive: true,
            addr: String::new(),
        };
        let st = ClusterStatus {
            node,
            peers: vec![],
            lent: vec![],
            borrowed: vec![],
            unmet_bytes: 0,
            handshakes: 3,
            handshake_us_p50: Some(300),
            handshake_us_p99: None,
            sent: vec![("grant".into(), 1)],
            received: vec![],
            datagrams: vec![],
            counters: vec![("migrations".into(), 2)],
        };
        let p = Proc {
            pid: 42,
            command: "/usr/bin/redis-server --port 1".into(),
            faults_from_store: 7,
            miss_us_p99: 118.8,
            ..Proc::default()
        };
        let text = render(&st, &[p]);
        for line in [
            "memlend_node_class{class=\"server\"} 1",
            "memlend_lent_bytes 2147483648",
            "memlend_messages_sent_total{type=\"grant\"} 1",
            "memlend_migrations_total 2",
            "memlend_handshake_latency_seconds{percentile=\"50\"} 0.0003",
            "memlend_process_faults_total{pid=\"42\",program=\"redis-server\",source=\"store\"} 7",
            "memlend_process_miss_latency_seconds{pid=\"42\",program=\"redis-server\",percentile=\"99\"} 0.0001188",
            "# EOF",
        ] {
            assert!(text.contains(line), "{line:?} is missing:\n{text}");
        }
    }
}
