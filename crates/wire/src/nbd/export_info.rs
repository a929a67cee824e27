//! Payloads of `NBD_REP_INFO` (one `info::*` item each) and `NBD_REP_SERVER`.
//!
//! ```text
//! INFO_EXPORT:      type u16 | size u64 | transmission flags u16      (12 bytes)
//! INFO_NAME:        type u16 | name
//! INFO_DESCRIPTION: type u16 | description
//! INFO_BLOCK_SIZE:  type u16 | minimum u32 | preferred u32 | maximum u32 (14 bytes)
//! REP_SERVER:       name length u32 | name | description
//! ```

use super::error::need;
use super::{be_u16, be_u32, be_u64, info, DecodeError};

pub const INFO_EXPORT_LEN: usize = 12;
pub const INFO_BLOCK_SIZE_LEN: usize = 14;

/// One item of export information.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    Export {
        size_bytes: u64,
        flags: u16,
    },
    Name(Vec<u8>),
    Description(Vec<u8>),
    BlockSize {
        bytes_min: u32,
        preferred_bytes: u32,
        bytes_max: u32,
    },
    /// A type this crate does not know; clients must ignore it.
    Unknown(u16),
}

impl Info {
    /// The `NBD_REP_INFO` payload for this item.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Info::Export { size_bytes, flags } => {
                let mut b = info::EXPORT.to_be_bytes().to_vec();
                b.extend_from_slice(&size_bytes.to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
                b
            }
            Info::Name(s) => typed_string(info::NAME, s),
            Info::Description(s) => typed_string(info::DESCRIPTION, s),
            Info::BlockSize { bytes_min, preferred_bytes, bytes_max } => {
                let mut b = info::BLOCK_SIZE.to_be_bytes().to_vec();
                for v in [bytes_min, preferred_bytes, bytes_max] {
                    b.extend_from_slice(&v.to_be_bytes());
                }
                b
            }
            Info::Unknown(t) => t.to_be_bytes().to_vec(),
        }
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("info", b, 2)?;
        let kind = be_u16(b, 0);
        let exact = |len: usize| {
            if b.len() == len {
                Ok(())
            } else {
                Err(DecodeError::BadLength {
                    what: "info",
                    got: b.len() as u64,
                    expected: len as u64,
                })
            }
        };
        Ok(match kind {
            info::EXPORT => {
                exact(INFO_EXPORT_LEN)?;
                Info::Export { size_bytes: be_u64(b, 2), flags: be_u16(b, 10) }
            }
            info::NAME => Info::Name(b[2..].to_vec()),
            info::DESCRIPTION => Info::Description(b[2..].to_vec()),
            info::BLOCK_SIZE => {
                exact(INFO_BLOCK_SIZE_LEN)?;
                let (bytes_min, preferred_bytes, bytes_max) =
                    (be_u32(b, 2), be_u32(b, 6), be_u32(b, 10));
                Info::BlockSize { bytes_min, preferred_bytes, bytes_max }
            }
            other => Info::Unknown(other),
        })
    }
}

fn typed_string(kind: u16, s: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + s.len());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(s);
    b
}

/// The `NBD_REP_SERVER` payload describing one export for `OPT_LIST`.
pub fn encode_rep_server(name: &[u8], description: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len() + description.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(description);
    b
}

/// Split an `NBD_REP_SERVER` payload into name and description.
pub fn decode_rep_server(b: &[u8]) -> Result<(&[u8], &[u8]), DecodeError> {
    need("server reply", b, 4)?;
    let name_len = be_u32(b, 0) as u64;
    let rest = (b.len() - 4) as u64;
    if name_len > rest {
        return Err(DecodeError::TooLong { what: "server reply name", got: name_len, limit: rest });
    }
    let name_end = 4 + name_len as usize;
    Ok((&b[4..name_end], &b[name_end..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_info() -> impl Strategy<Value = Info> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..64);
        prop_oneof![
            (any::<u64>(), any::<u16>())
                .prop_map(|(size_bytes, flags)| Info::Export { size_bytes, flags }),
            bytes().prop_map(Info::Name),
            bytes().prop_map(Info::Description),
            (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(a, b, c)| Info::BlockSize {
                bytes_min: a,
                preferred_bytes: b,
                bytes_max: c
            }),
            (4u16..).prop_map(Info::Unknown),
        ]
    }

    proptest! {
        #[test]
        fn info_round_trips(i in any_info()) {
            prop_assert_eq!(Info::decode(&i.encode()).unwrap(), i);
        }

        #[test]
        fn rep_server_round_trips(name in proptest::collection::vec(any::<u8>(), 0..64),
                                  desc in proptest::collection::vec(any::<u8>(), 0..64)) {
            let b = encode_rep_server(&name, &desc);
            let (n, d) = decode_rep_server(&b).unwrap();
            prop_assert_eq!((n, d), (&name[..], &desc[..]));
        }
    }

    #[test]
    fn short_fixed_items_are_refused() {
        assert!(Info::decode(&[0, 0, 1, 2]).is_err());
        assert!(Info::decode(&[0, 3, 0, 0, 0, 1]).is_err());
        assert!(decode_rep_server(&[0, 0, 0, 9, b'a']).is_err());
    }
}
