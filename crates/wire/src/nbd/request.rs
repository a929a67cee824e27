//! The 28-byte transmission request header.
//!
//! ```text
//!  0 magic    u32  REQUEST_MAGIC
//!  4 flags    u16  cmd_flags::*
//!  6 type     u16  Command (raw: an unknown one is answered with EINVAL)
//!  8 cookie   u64  opaque, echoed in the reply
//! 16 offset   u64  bytes
//! 24 length   u32  bytes; a WRITE carries this many bytes of data after
//! ```

use super::error::need;
use super::{be_u16, be_u32, be_u64, Command, DecodeError, REQUEST_MAGIC};

pub const REQUEST_LEN: usize = 28;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    pub fn new(command: Command, cookie: u64, offset: u64, len: u32) -> Self {
        Request { flags: 0, kind: command as u16, cookie, offset, len }
    }

    pub fn command(&self) -> Option<Command> {
        Command::from_wire(self.kind)
    }

    /// Bytes of data that follow this header on the wire. Only a WRITE has
    /// any; an unknown command is assumed to have none (nothing else is
    /// knowable about it).
    pub fn payload_len(&self) -> u32 {
        if self.command() == Some(Command::Write) {
            self.len
        } else {
            0
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decode a header. Only the magic is checked: a bad one means the
    /// stream is out of step and cannot go on. Everything else is the
    /// server's to judge (and answer) per command.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("request", b, REQUEST_LEN)?;
        let magic = be_u32(b, 0);
        if magic != REQUEST_MAGIC {
            return Err(DecodeError::BadMagic { what: "request", got: magic as u64 });
        }
        Ok(Request {
            flags: be_u16(b, 4),
            kind: be_u16(b, 6),
            cookie: be_u64(b, 8),
            offset: be_u64(b, 16),
            len: be_u32(b, 24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(flags in any::<u16>(), kind in any::<u16>(), cookie in any::<u64>(),
                       offset in any::<u64>(), len in any::<u32>()) {
            let r = Request { flags, kind, cookie, offset, len };
            prop_assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn a_flipped_magic_bit_is_caught(bit in 0usize..32) {
            let mut b = Request::new(Command::Read, 1, 0, 4096).encode();
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Request::decode(&b).is_err());
        }
    }

    #[test]
    fn only_writes_carry_payload() {
        assert_eq!(Request::new(Command::Write, 1, 0, 512).payload_len(), 512);
        assert_eq!(Request::new(Command::Read, 1, 0, 512).payload_len(), 0);
        assert_eq!(Request::new(Command::WriteZeroes, 1, 0, 512).payload_len(), 0);
        let unknown = Request { kind: 99, len: 512, ..Default::default() };
        assert_eq!(unknown.payload_len(), 0);
    }
}
