//! The transmission phase: read what the socket has, serve every complete
//! request in it, then send all their replies with one write. On a fast
//! store that batching is where the throughput comes from: one `read` and
//! one `write` per batch instead of per request.

use super::buffers::InBuf;
use super::config::NbdConfig;
use super::error::ConnError;
use super::framing::{next_frame, Frame};
use super::session::{Op, Session};
use super::wire::{Wire, WireReader};
use crate::out_buf::OutBuf;
use memlend_net::spin_for;
use memlend_wire::nbd::Errno;
use std::io;
use std::time::Duration;

/// How a connection in transmission ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The client sent NBD_CMD_DISC; all its requests were answered.
    Disconnected,
    /// The client closed the socket; `pending_bytes` of a request were cut off.
    Closed { pending_bytes: usize },
}

/// A frame still missing this much is received with one blocking call.
const LARGE_REST_BYTES: usize = 16 << 10;

enum Step {
    Continue,
    Disconnect,
}

/// Where requests go once they have passed validation.
pub(crate) trait Dispatch {
    /// Serve `op` (never DISC); its reply may go into `out` or elsewhere.
    fn dispatch(
        &mut self,
        cookie: u64,
        op: Op,
        payload: &[u8],
        out: &mut OutBuf,
    ) -> Result<(), ConnError>;
    /// Send `out`, the batch of replies produced on the reading thread.
    fn send(&mut self, out: &[u8]) -> io::Result<()>;
}

/// The connection loop shared by the inline path and the worker pool.
/// `spin` is how long to poll for more input before sleeping in a read.
pub(crate) fn run<W: Wire>(
    stream: &W,
    s: &Session,
    cfg: &NbdConfig,
    spin: Duration,
    d: &mut impl Dispatch,
) -> Result<End, ConnError> {
    let mut inbuf = InBuf::new(cfg.input_buffer_bytes);
    let mut out = OutBuf::new(cfg.reply_batch_bytes_max);
    loop {
        let step = serve_buffered(&mut inbuf, &mut out, s, cfg, d);
        if !out.is_empty() {
            d.send(out.as_slice())?;
            out.clear();
        }
        if let Step::Disconnect = step? {
            return Ok(End::Disconnected);
        }
        let got = if inbuf.missing() >= LARGE_REST_BYTES {
            receive_rest(&mut inbuf, stream)?
        } else if let Some(n) = receive_spinning(&mut inbuf, stream, spin)? {
            n
        } else {
            // Idle: give back memory grown for large requests, then sleep.
            inbuf.shrink_if_empty();
            out.shrink_if_empty();
            inbuf.read_from(&mut WireReader(stream))?
        };
        if got == 0 {
            return Ok(End::Closed { pending_bytes: inbuf.pending().len() });
        }
    }
}

/// Wait for the rest of a large frame in one blocking call. Spinning there
/// would take it in many small pieces, and each poll contends for the socket
/// lock with the sender's delivery of the next piece.
fn receive_rest(inbuf: &mut InBuf, stream: &impl Wire) -> io::Result<usize> {
    let missing = inbuf.missing();
    let got = inbuf.fill(|b| {
        let n = b.len().min(missing);
        stream.read_full(&mut b[..n]).map(Some)
    })?;
    Ok(got.unwrap_or(0))
}

/// Poll for input for up to `spin`; None if nothing came.
fn receive_spinning(
    inbuf: &mut InBuf,
    stream: &impl Wire,
    spin: Duration,
) -> io::Result<Option<usize>> {
    inbuf.fill(|b| spin_for(spin, || stream.read_nowait(b)))
}

/// Serve every complete request in `inbuf`. Bounded by the buffer: each
/// pass consumes a request or returns.
fn serve_buffered(
    inbuf: &mut InBuf,
    out: &mut OutBuf,
    s: &Session,
    cfg: &NbdConfig,
    d: &mut impl Dispatch,
) -> Result<Step, ConnError> {
    loop {
        if out.len() >= cfg.reply_batch_bytes_max {
            d.send(out.as_slice())?;
            out.clear();
        }
        let (req, payload) = match next_frame(inbuf, cfg)? {
            Frame::Incomplete => return Ok(Step::Continue),
            Frame::Request { req, payload } => (req, payload),
            Frame::Oversize { req, closing } => {
                s.reply_error(
                    out,
                    req.cookie,
                    Errno::Inval,
                    "write larger than the maximum block size",
                );
                if closing {
                    let limit_bytes = cfg.skip_write_bytes_max;
                    return Err(ConnError::OversizeWrite { len_bytes: req.len, limit_bytes });
                }
                continue;
            }
        };
        match s.validate(&req) {
            Err(r) => s.reply_error(out, req.cookie, r.errno, r.why),
            Ok(Op::Disc) => return Ok(Step::Disconnect),
            Ok(op) => d.dispatch(req.cookie, op, inbuf.bytes(payload), out)?,
        }
    }
}

/// Serve on the connection thread: for stores whose operations cost about
/// a memcpy, a hand-off to another core would cost more than the work.
struct Inline<'a, W: Wire> {
    session: &'a Session,
    stream: &'a W,
}

impl<W: Wire> Dispatch for Inline<'_, W> {
    fn dispatch(
        &mut self,
        cookie: u64,
        op: Op,
        payload: &[u8],
        out: &mut OutBuf,
    ) -> Result<(), ConnError> {
        self.session.execute(cookie, op, payload, out);
        Ok(())
    }

    fn send(&mut self, out: &[u8]) -> io::Result<()> {
        self.stream.write_all_bytes(out)
    }
}

pub(crate) fn serve_inline<W: Wire>(
    stream: &W,
    s: &Session,
    cfg: &NbdConfig,
) -> Result<End, ConnError> {
    let spin_us = if W::SPIN { cfg.spin_before_sleep_us } else { 0 };
    let spin = Duration::from_micros(spin_us);
    run(stream, s, cfg, spin, &mut Inline { session: s, stream })
}
