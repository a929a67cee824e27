//! The NBD export: a server of the NBD protocol (fixed newstyle) over page
//! stores, for unmodified clients (Linux `nbd-client`, qemu, libnbd, fio).
//! `docs/nbd.md` lists what is supported and how to use it.
//!
//! Threads: one accept thread per listener (TCP, Unix), one per connection
//! (from `lifecycle::accept_loop` and `accept_loop_unix`). On a fast
//! store every request is served on that thread and replies are batched;
//! on a slow one a small bounded pool per connection answers out of order.

mod allow;
mod block_status;
mod buffers;
mod byte_io;
mod command;
mod config;
mod connection;
mod errno;
mod error;
mod export;
mod framing;
mod handshake;
mod meta_context;
mod peer;
mod server;
mod session;
mod socket;
mod tls;
mod tls_pump;
mod tls_wire;
mod transmission;
mod wire;
mod workers;

pub use allow::Cidr;
pub use config::NbdConfig;
pub use error::ConnError;
pub use export::Export;
pub use tls::Tls;

use crate::lifecycle::{accept_loop, accept_loop_unix, Shutdown};
use peer::Peer;
use server::Server;
use std::io;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::thread;

/// Where clients connect.
pub enum Listener {
    /// Clients outside `NbdConfig::allow` are closed at accept.
    Tcp(TcpListener),
    /// No address to check: the socket file's permissions decide who may
    /// connect, and `allow` does not apply.
    Unix(UnixListener),
}

/// Serve `exports` on `listener` until `shutdown` stops. `exports[0]` is the
/// default export, also served for the empty name. Fails at once (before
/// accepting) on an invalid configuration or export list.
pub fn serve(
    listener: TcpListener,
    exports: Vec<Export>,
    cfg: NbdConfig,
    shutdown: Shutdown,
) -> io::Result<()> {
    serve_all(vec![Listener::Tcp(listener)], exports, cfg, shutdown)
}

/// `serve` on several listeners at once, one accept thread each. Clients
/// of every listener share the exports (their stores and read-modify-write
/// locks) and, through `shutdown`, the connection limit.
pub fn serve_all(
    listeners: Vec<Listener>,
    exports: Vec<Export>,
    cfg: NbdConfig,
    shutdown: Shutdown,
) -> io::Result<()> {
    let server = Arc::new(Server::new(exports, cfg, shutdown.clone())?);
    let mut threads = Vec::new();
    for listener in listeners {
        let (server, shutdown) = (Arc::clone(&server), shutdown.clone());
        let thread = thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept(listener, server, shutdown))?;
        threads.push(thread);
    }
    let mut result = Ok(());
    for t in threads {
        match t.join() {
            Ok(Err(e)) if result.is_ok() => result = Err(e),
            Ok(_) => {}
            Err(_) => result = Err(io::Error::other("nbd accept thread panicked")),
        }
    }
    result
}

fn accept(listener: Listener, server: Arc<Server>, shutdown: Shutdown) -> io::Result<()> {
    let connections_max = server.cfg.connections_max;
    match listener {
        Listener::Tcp(l) => {
            accept_loop("nbd", l, shutdown, connections_max, move |stream, peer| {
                if !allow::allowed(&server.cfg.allow, peer.ip()) {
                    tracing::warn!(%peer, "NBD client not in the allowlist: closed");
                    return;
                }
                connection::handle(stream, Peer::Tcp(peer), &server)
            })
        }
        Listener::Unix(l) => accept_loop_unix("nbd", l, shutdown, connections_max, move |stream| {
            let peer = Peer::of_unix(&stream);
            connection::handle(stream, peer, &server)
        }),
    }
}
