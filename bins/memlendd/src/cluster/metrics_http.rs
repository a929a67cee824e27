//! `--metrics ADDR`: Prometheus text over a minimal HTTP/1.0 responder. Each
//! scrape asks the control loop for a snapshot (it owns the engine).

use super::wake::Waker;
use memlend_pool::api::ClusterStatus;
use memlend_server::lifecycle::{poll_accept, Shutdown};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
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
            Ok(st) => render(&st),
            Err(_) => return,
        };
        let _ = write!(s, "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    });
}

fn render(st: &ClusterStatus) -> String {
    let mut o = String::new();
    let n = &st.node;
    for class in ["neutral", "server", "client"] {
        let v = u8::from(n.class == class);
        let _ = writeln!(o, "memlend_node_class{{class=\"{class}\"}} {v}");
    }
    let _ = writeln!(o, "memlend_memory_total_bytes {}", n.total_bytes);
    let _ = writeln!(o, "memlend_memory_used_bytes {}", n.used_bytes);
    let _ = writeln!(o, "memlend_lent_bytes {}", n.lent_bytes);
    let _ = writeln!(o, "memlend_borrowed_bytes {}", n.borrowed_bytes);
    let _ = writeln!(o, "memlend_leases_lent {}", st.lent.len());
    let _ = writeln!(o, "memlend_leases_borrowed {}", st.borrowed.len());
    let _ = writeln!(o, "memlend_peers {}", st.peers.len());
    let _ = writeln!(o, "memlend_unmet_demand_bytes {}", st.unmet_bytes);
    for (kind, v) in &st.sent {
        let _ = writeln!(o, "memlend_messages_sent_total{{type=\"{kind}\"}} {v}");
    }
    for (kind, v) in &st.received {
        let _ = writeln!(o, "memlend_messages_received_total{{type=\"{kind}\"}} {v}");
    }
    for (what, v) in &st.datagrams {
        let _ = writeln!(o, "memlend_datagrams_total{{what=\"{what}\"}} {v}");
    }
    for (what, v) in &st.counters {
        let _ = writeln!(o, "memlend_{what}_total {v}");
    }
    let _ = writeln!(o, "memlend_handshakes_total {}", st.handshakes);
    if let (Some(p50), Some(p99)) = (st.handshake_us_p50, st.handshake_us_p99) {
        let _ = writeln!(o, "memlend_handshake_seconds{{quantile=\"0.5\"}} {}", p50 as f64 / 1e6);
        let _ = writeln!(o, "memlend_handshake_seconds{{quantile=\"0.99\"}} {}", p99 as f64 / 1e6);
    }
    o
}
