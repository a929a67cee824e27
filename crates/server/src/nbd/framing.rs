//! Cutting the input stream into requests: a header, and for a WRITE its
//! payload, both whole in the input buffer before anything is served.

use super::buffers::InBuf;
use super::config::NbdConfig;
use memlend_wire::nbd::{DecodeError, Request, REQUEST_LEN};
use std::ops::Range;

pub(crate) enum Frame {
    /// A request and where its payload lies in the input buffer (empty
    /// unless it is a WRITE); valid until the buffer is next read into.
    Request { req: Request, payload: Range<usize> },
    /// A WRITE whose payload is larger than `request_bytes_max`. It must be
    /// answered with EINVAL. Its payload is being skipped unless `closing`:
    /// then it is too large even to read and the connection must end.
    Oversize { req: Request, closing: bool },
    /// More bytes are needed.
    Incomplete,
}

/// Take the next whole request from `inbuf`, if there is one. A bad magic
/// is an error: the stream is out of step and cannot be trusted further.
pub(crate) fn next_frame(inbuf: &mut InBuf, cfg: &NbdConfig) -> Result<Frame, DecodeError> {
    if inbuf.is_skipping() || inbuf.pending().len() < REQUEST_LEN {
        return Ok(Frame::Incomplete);
    }
    let req = Request::decode(inbuf.pending())?;
    let payload_bytes = req.payload_len() as usize;
    if payload_bytes > cfg.request_bytes_max as usize {
        inbuf.consume(REQUEST_LEN);
        let closing = payload_bytes as u64 > cfg.skip_write_bytes_max;
        if !closing {
            inbuf.skip(payload_bytes as u64);
        }
        return Ok(Frame::Oversize { req, closing });
    }
    let total = REQUEST_LEN + payload_bytes;
    if inbuf.pending().len() < total {
        inbuf.make_room(total);
        return Ok(Frame::Incomplete);
    }
    let at = inbuf.start() + REQUEST_LEN;
    inbuf.consume(total);
    Ok(Frame::Request { req, payload: at..at + payload_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memlend_wire::nbd::Command;

    /// Read all of `bytes` in, as the connection loop does: framing between
    /// reads makes room for the frame being waited for.
    fn feed(inbuf: &mut InBuf, cfg: &NbdConfig, mut bytes: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            inbuf.read_from(&mut bytes).unwrap();
            loop {
                match next_frame(inbuf, cfg) {
                    Ok(Frame::Incomplete) => break,
                    Ok(f) => frames.push(f),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        frames
    }

    #[test]
    fn a_write_is_framed_only_once_its_payload_is_in() {
        let cfg = NbdConfig::default();
        let mut inbuf = InBuf::new(4096);
        let mut wire = Request::new(Command::Write, 9, 0, 10_000).encode().to_vec();
        wire.extend(std::iter::repeat_n(5u8, 10_000));
        assert!(feed(&mut inbuf, &cfg, &wire[..5_000]).is_empty());
        let frames = feed(&mut inbuf, &cfg, &wire[5_000..]);
        let [Frame::Request { req, payload }] = &frames[..] else { panic!("one frame expected") };
        assert_eq!((req.cookie, payload.len()), (9, 10_000));
        assert!(inbuf.bytes(payload.clone()).iter().all(|&b| b == 5));
    }

    #[test]
    fn oversize_writes_are_skipped_or_closed() {
        let cfg =
            NbdConfig { request_bytes_max: 4096, skip_write_bytes_max: 8192, ..Default::default() };
        let mut inbuf = InBuf::new(4096);
        let mut wire = Request::new(Command::Write, 1, 0, 5000).encode().to_vec();
        wire.extend(std::iter::repeat_n(0u8, 5000));
        wire.extend(Request::new(Command::Flush, 2, 0, 0).encode());
        wire.extend(Request::new(Command::Write, 3, 0, 9000).encode());
        let frames = feed(&mut inbuf, &cfg, &wire);
        assert!(matches!(frames[0], Frame::Oversize { req, closing: false } if req.cookie == 1));
        assert!(matches!(frames[1], Frame::Request { req, .. } if req.cookie == 2));
        assert!(matches!(frames[2], Frame::Oversize { req, closing: true } if req.cookie == 3));
    }

    #[test]
    fn bad_magic_is_an_error() {
        let mut bad = InBuf::new(4096);
        let mut src: &[u8] = &[0xff; 28];
        bad.read_from(&mut src).unwrap();
        assert!(next_frame(&mut bad, &NbdConfig::default()).is_err());
    }
}
