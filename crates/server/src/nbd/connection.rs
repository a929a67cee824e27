//! One client from accept to close: handshake, then transmission inline or
//! through the worker pool depending on the store. Whatever goes wrong is
//! logged with the peer and ends this connection only.

use super::error::ConnError;
use super::handshake::{negotiate, Negotiated};
use super::server::Server;
use super::transmission::{serve_inline, End};
use super::workers::serve_pooled;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub(crate) fn handle(stream: TcpStream, peer: SocketAddr, server: &Server) {
    match serve(&stream, peer, server) {
        Ok(None) => tracing::debug!(%peer, "nbd client aborted negotiation"),
        Ok(Some(End::Disconnected)) => tracing::debug!(%peer, "nbd client disconnected"),
        Ok(Some(End::Closed { pending_bytes: 0 })) => {
            tracing::debug!(%peer, "nbd client closed the connection without NBD_CMD_DISC")
        }
        Ok(Some(End::Closed { pending_bytes })) => {
            tracing::warn!(%peer, pending_bytes, "nbd client vanished in the middle of a request")
        }
        Err(e) => tracing::warn!(%peer, error = %e, "nbd connection closed"),
    }
}

fn serve(stream: &TcpStream, peer: SocketAddr, server: &Server) -> Result<Option<End>, ConnError> {
    let timeout = (server.cfg.handshake_timeout_ms > 0)
        .then(|| Duration::from_millis(server.cfg.handshake_timeout_ms));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    let negotiated = negotiate(&mut { stream }, server, peer);
    let session = match negotiated.map_err(|e| e.in_handshake(server.cfg.handshake_timeout_ms))? {
        Negotiated::Aborted => return Ok(None),
        Negotiated::Transmit(s) => s,
    };
    // Transmission may idle for as long as the client likes.
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let export = &session.export;
    tracing::info!(%peer, export = %export.name, structured = session.structured,
        fast = export.caps.fast, "nbd client entered transmission");
    let cfg = &server.cfg;
    let end = if export.caps.fast {
        serve_inline(stream, &session, cfg)
    } else {
        serve_pooled(stream, &session, cfg)
    };
    end.map(Some)
}
