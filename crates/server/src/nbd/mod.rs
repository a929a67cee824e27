//! The NBD export: a server of the NBD protocol (fixed newstyle) over page
//! stores, for unmodified clients (Linux `nbd-client`, qemu, libnbd, fio).
//! `docs/nbd.md` lists what is supported and how to use it.
//!
//! Threads: one per connection (from `lifecycle::accept_loop`). On a fast
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
mod server;
mod session;
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

use crate::lifecycle::{accept_loop, Shutdown};
use server::Server;
use std::io;
use std::net::TcpListener;
use std::sync::Arc;

/// Serve `exports` on `listener` until `shutdown` stops. `exports[0]` is the
/// default export, also served for the empty name. Fails at once (before
/// accepting) on an invalid configuration or export list.
pub fn serve(
    listener: TcpListener,
    exports: Vec<Export>,
    cfg: NbdConfig,
    shutdown: Shutdown,
) -> io::Result<()> {
    let server = Arc::new(Server::new(exports, cfg, shutdown.clone())?);
    let max_connections = server.cfg.max_connections;
    accept_loop("nbd", listener, shutdown, max_connections, move |stream, peer| {
        if !allow::allowed(&server.cfg.allow, peer.ip()) {
            tracing::warn!(%peer, "NBD client not in the allowlist: closed");
            return;
        }
        connection::handle(stream, peer, &server)
    })
}
