//! The NBD transmission phase as the server reads it: the input is a stream
//! of requests, cut up the way `next_frame` in
//! `crates/server/src/nbd/framing.rs` does (a 28-byte header, then the
//! payload of a WRITE). A bad magic ends the stream, as it ends the
//! connection. For each header: no panic, it re-encodes to exactly its
//! bytes, and only a WRITE claims payload bytes.
//!
//! The server's checks on a decoded request (command flags, offset and
//! length against the export size and alignment, the maximum request
//! length) are `Session::validate`, which is crate-private and needs a
//! live export, so they are not reached from here; the server's unit tests
//! cover them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memlend_wire::nbd::{Command, DecodeError, Request, REQUEST_LEN};

/// `NbdConfig::default()` of the server: a WRITE longer than this is not
/// even read (the connection ends); a shorter one over the 32 MiB request
/// limit has its payload skipped, so the next header follows it either way.
const SKIP_WRITE_BYTES_MAX: u64 = 64 << 20;

fn check(req: &Request, raw: &[u8]) {
    assert_eq!(&req.encode()[..], raw, "request does not re-encode to its bytes");
    assert_eq!(Request::decode(raw), Ok(*req));
    let cmd = req.command();
    assert_eq!(cmd, Command::from_wire(req.kind));
    if let Some(c) = cmd {
        assert_eq!(c as u16, req.kind);
    }
    let payload = req.payload_len();
    if cmd == Some(Command::Write) {
        assert_eq!(payload, req.len);
    } else {
        assert_eq!(payload, 0);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = data;
    loop {
        let req = match Request::decode(input) {
            Ok(req) => req,
            Err(DecodeError::Truncated { got, need, .. }) => {
                assert!(input.len() < REQUEST_LEN && got == input.len() && need == REQUEST_LEN);
                return;
            }
            Err(DecodeError::BadMagic { .. }) => return,
            Err(e) => panic!("a request header can only be short or out of step: {e}"),
        };
        check(&req, &input[..REQUEST_LEN]);
        input = &input[REQUEST_LEN..];
        let payload = req.payload_len() as usize;
        let closing = payload as u64 > SKIP_WRITE_BYTES_MAX;
        if closing || input.len() < payload || req.command() == Some(Command::Disc) {
            return;
        }
        input = &input[payload..];
    }
});
