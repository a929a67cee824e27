//! The fixed-newstyle greeting, the client's flags, and the reply that ends
//! negotiation through `OPT_EXPORT_NAME`.
//!
//! ```text
//! S: NBDMAGIC u64 | IHAVEOPT u64 | handshake flags u16       (18 bytes)
//! C: client flags u32                                         (4 bytes)
//! ...options...
//! S (after OPT_EXPORT_NAME): size u64 | transmission flags u16 | 124 zeroes
//!   (the zeroes are left out when both sides agreed on NO_ZEROES)
//! ```

use super::error::need;
use super::{be_u16, be_u32, be_u64, client_flags, DecodeError, IHAVEOPT, NBDMAGIC};

pub const GREETING_LEN: usize = 18;
pub const CLIENT_FLAGS_LEN: usize = 4;
/// Size and flags, without the zero padding.
pub const EXPORT_NAME_REPLY_LEN: usize = 10;
/// The legacy zero padding after the `OPT_EXPORT_NAME` reply.
pub const EXPORT_NAME_PADDING_LEN: usize = 124;

/// What the server says first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Greeting {
    pub handshake_flags: u16,
}

impl Greeting {
    pub fn encode(&self) -> [u8; GREETING_LEN] {
        let mut b = [0u8; GREETING_LEN];
        b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[16..18].copy_from_slice(&self.handshake_flags.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("greeting", b, GREETING_LEN)?;
        let magic = be_u64(b, 0);
        if magic != NBDMAGIC {
            return Err(DecodeError::BadMagic { what: "greeting", got: magic });
        }
        let newstyle = be_u64(b, 8);
        if newstyle != IHAVEOPT {
            return Err(DecodeError::BadMagic { what: "greeting (not newstyle)", got: newstyle });
        }
        Ok(Greeting { handshake_flags: be_u16(b, 16) })
    }
}

/// The client's answer to the greeting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

impl ClientFlags {
    pub fn encode(&self) -> [u8; CLIENT_FLAGS_LEN] {
        let mut v = 0;
        if self.fixed_newstyle {
            v |= client_flags::C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            v |= client_flags::C_NO_ZEROES;
        }
        v.to_be_bytes()
    }

    /// Decode, refusing any bit not in `offered` (the client bits matching
    /// the server's handshake flags): the protocol says the server must then
    /// drop the connection.
    pub fn decode(b: &[u8], offered: u32) -> Result<Self, DecodeError> {
        need("client flags", b, CLIENT_FLAGS_LEN)?;
        let v = be_u32(b, 0);
        if v & !(offered & client_flags::KNOWN) != 0 {
            return Err(DecodeError::UnknownClientFlags(v));
        }
        Ok(ClientFlags {
            fixed_newstyle: v & client_flags::C_FIXED_NEWSTYLE != 0,
            no_zeroes: v & client_flags::C_NO_ZEROES != 0,
        })
    }
}

/// Append the reply to `OPT_EXPORT_NAME`: size, flags, and the padding
/// unless `no_zeroes` was agreed.
pub fn encode_export_name_reply(out: &mut Vec<u8>, size_bytes: u64, flags: u16, no_zeroes: bool) {
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING_LEN]);
    }
}

/// Decode the size and flags of an `OPT_EXPORT_NAME` reply (padding ignored).
pub fn decode_export_name_reply(b: &[u8]) -> Result<(u64, u16), DecodeError> {
    need("export name reply", b, EXPORT_NAME_REPLY_LEN)?;
    Ok((be_u64(b, 0), be_u16(b, 8)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn greeting_round_trips(flags in any::<u16>()) {
            let g = Greeting { handshake_flags: flags };
            prop_assert_eq!(Greeting::decode(&g.encode()).unwrap(), g);
        }

        #[test]
        fn client_flags_round_trip(fixed in any::<bool>(), nz in any::<bool>()) {
            let f = ClientFlags { fixed_newstyle: fixed, no_zeroes: nz };
            prop_assert_eq!(ClientFlags::decode(&f.encode(), client_flags::KNOWN).unwrap(), f);
        }

        #[test]
        fn export_name_reply_round_trips(size in any::<u64>(), flags in any::<u16>(), nz in any::<bool>()) {
            let mut out = Vec::new();
            encode_export_name_reply(&mut out, size, flags, nz);
            let padding = if nz { 0 } else { EXPORT_NAME_PADDING_LEN };
            prop_assert_eq!(out.len(), EXPORT_NAME_REPLY_LEN + padding);
            prop_assert_eq!(decode_export_name_reply(&out).unwrap(), (size, flags));
        }
    }

    #[test]
    fn unoffered_client_flags_are_refused() {
        let b = client_flags::C_NO_ZEROES.to_be_bytes();
        assert!(ClientFlags::decode(&b, client_flags::C_FIXED_NEWSTYLE).is_err());
        assert!(ClientFlags::decode(&(1u32 << 7).to_be_bytes(), client_flags::KNOWN).is_err());
        assert!(ClientFlags::decode(&[0, 0], client_flags::KNOWN).is_err());
    }
}
