//! One client from accept to close: handshake, then transmission inline or
//! through the worker pool depending on the store. Whatever goes wrong is
//! logged with the peer and ends this connection only.

use super::error::ConnError;
use super::handshake::{haggle, negotiate, Haggle, Negotiated};
use super::peer::Peer;
use super::server::Server;
use super::session::Session;
use super::socket::{Socket, SocketIo};
use super::tls_pump;
use super::tls_wire::TlsWire;
use super::transmission::{serve_inline, End};
use super::wire::{Relayed, Wire};
use super::workers::serve_pooled;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

/// Serve one client on `stream`, a TCP or Unix socket whose `Wire` serves
/// transmission in the clear.
pub(crate) fn handle<S: Socket + Wire>(stream: S, peer: Peer, server: &Server) {
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

fn serve<S: Socket + Wire>(
    stream: &S,
    peer: Peer,
    server: &Server,
) -> Result<Option<End>, ConnError> {
    let timeout = (server.cfg.handshake_timeout_ms > 0)
        .then(|| Duration::from_millis(server.cfg.handshake_timeout_ms));
    stream.set_timeouts(timeout)?;
    let in_handshake = |e: ConnError| e.in_handshake(server.cfg.handshake_timeout_ms);
    let session = match negotiate(&mut SocketIo(stream), server, peer).map_err(in_handshake)? {
        Negotiated::Aborted => return Ok(None),
        Negotiated::Transmit(s) => s,
        Negotiated::StartTls(h) => return serve_tls(stream, peer, server, h),
    };
    // Transmission may idle for as long as the client likes.
    stream.set_timeouts(None)?;
    transmit(stream, &session, server, false).map(Some)
}

/// After STARTTLS: the TLS handshake, the rest of the options inside it,
/// then transmission: on this thread through the session for a fast store
/// (`tls_wire.rs`), through the relay thread for the worker pool
/// (`tls_pump.rs`).
fn serve_tls<S: Socket>(
    stream: &S,
    peer: Peer,
    server: &Server,
    h: Haggle,
) -> Result<Option<End>, ConnError> {
    let in_handshake = |e: ConnError| e.in_handshake(server.cfg.handshake_timeout_ms);
    let tls = server.cfg.tls.as_ref().expect("STARTTLS is acknowledged only with TLS on");
    let mut conn = tls.accept(stream).map_err(|e| in_handshake(e.into()))?;
    let mut io = SocketIo(stream);
    let negotiated = haggle(&mut rustls::Stream::new(&mut conn, &mut io), server, peer, h);
    let session = match negotiated.map_err(in_handshake)? {
        Negotiated::Transmit(s) => s,
        Negotiated::Aborted => {
            conn.send_close_notify();
            let _ = conn.write_tls(&mut io);
            return Ok(None);
        }
        Negotiated::StartTls(_) => unreachable!("a second STARTTLS is refused"),
    };
    stream.set_timeouts(None)?;
    if session.export.caps.fast {
        let wire = TlsWire::new(conn, stream.try_clone()?)?;
        let end = transmit(&wire, &session, server, true);
        wire.close();
        return end.map(Some);
    }
    let (plain, relayed) = UnixStream::pair()?;
    let plain = Relayed(plain);
    let client = stream.try_clone()?;
    let pump = thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || tls_pump::relay(conn, client, relayed))?;
    let end = transmit(&plain, &session, server, true);
    // The relay ends when the plain side closes (after its close_notify).
    plain.shutdown_both();
    match pump.join() {
        Ok(Err(e)) if end.is_ok() => return Err(e.into()),
        Ok(_) => {}
        Err(_) => tracing::error!(%peer, "nbd tls relay panicked"),
    }
    end.map(Some)
}

fn transmit<W: Wire>(
    stream: &W,
    session: &Session,
    server: &Server,
    tls: bool,
) -> Result<End, ConnError> {
    let export = &session.export;
    tracing::info!(peer = %session.peer, export = %export.name, structured = session.structured,
        fast = export.caps.fast, tls, "nbd client entered transmission");
    let cfg = &server.cfg;
    if export.caps.fast {
        serve_inline(stream, session, cfg)
    } else {
        serve_pooled(stream, session, cfg)
    }
}
