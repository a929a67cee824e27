//! Option haggling: the option header, the option reply header, and the
//! payload of `OPT_INFO` / `OPT_GO`.
//!
//! ```text
//! C: IHAVEOPT u64 | option u32 | length u32 | data[length]
//! S: OPT_REPLY_MAGIC u64 | option u32 | reply type u32 | length u32 | data[length]
//! OPT_INFO/OPT_GO data: name length u32 | name | count u16 | count x info u16
//! ```

use super::error::need;
use super::{be_u16, be_u32, be_u64, DecodeError, IHAVEOPT, OPT_REPLY_MAGIC, STRING_BYTES_MAX};

pub const OPT_HEADER_LEN: usize = 16;
pub const OPT_REPLY_HEADER_LEN: usize = 20;

/// The header of one client option. `len` bytes of data follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptHeader {
    pub option: u32,
    pub len: u32,
}

impl OptHeader {
    pub fn encode(&self) -> [u8; OPT_HEADER_LEN] {
        let mut b = [0u8; OPT_HEADER_LEN];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("option header", b, OPT_HEADER_LEN)?;
        let magic = be_u64(b, 0);
        if magic != IHAVEOPT {
            return Err(DecodeError::BadMagic { what: "option header", got: magic });
        }
        Ok(OptHeader { option: be_u32(b, 8), len: be_u32(b, 12) })
    }
}

/// The header of one option reply. `len` bytes of data follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

impl OptReplyHeader {
    pub fn encode(&self) -> [u8; OPT_REPLY_HEADER_LEN] {
        let mut b = [0u8; OPT_REPLY_HEADER_LEN];
        b[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.reply.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("option reply header", b, OPT_REPLY_HEADER_LEN)?;
        let magic = be_u64(b, 0);
        if magic != OPT_REPLY_MAGIC {
            return Err(DecodeError::BadMagic { what: "option reply header", got: magic });
        }
        Ok(OptReplyHeader { option: be_u32(b, 8), reply: be_u32(b, 12), len: be_u32(b, 16) })
    }
}

/// Append one option reply (header and payload) to `out`.
/// Payloads are built by this crate and are far below 4 GiB.
pub fn encode_opt_reply(out: &mut Vec<u8>, option: u32, reply: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("option reply payload over 4 GiB");
    out.extend_from_slice(&OptReplyHeader { option, reply, len }.encode());
    out.extend_from_slice(payload);
}

/// The data of `OPT_INFO` and `OPT_GO`: which export, and what to tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub name: &'a [u8],
    /// Information types asked for (`info::*`), unknown ones included.
    pub requests: Vec<u16>,
}

impl<'a> InfoRequest<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(6 + self.name.len() + 2 * self.requests.len());
        b.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        b.extend_from_slice(self.name);
        b.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            b.extend_from_slice(&r.to_be_bytes());
        }
        b
    }

    /// Decode the whole option data `b`; its length must match exactly.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        need("info request", b, 4)?;
        let name_len = be_u32(b, 0) as u64;
        if name_len > STRING_BYTES_MAX as u64 {
            let limit = STRING_BYTES_MAX as u64;
            return Err(DecodeError::TooLong { what: "export name", got: name_len, limit });
        }
        let name_end = 4 + name_len as usize;
        need("info request", b, name_end + 2)?;
        let count = be_u16(b, name_end) as usize;
        let expected = name_end + 2 + 2 * count;
        if b.len() != expected {
            let (got, expected) = (b.len() as u64, expected as u64);
            return Err(DecodeError::BadLength { what: "info request", got, expected });
        }
        let requests = (0..count).map(|i| be_u16(b, name_end + 2 + 2 * i)).collect();
        Ok(InfoRequest { name: &b[4..name_end], requests })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn opt_header_round_trips(option in any::<u32>(), len in any::<u32>()) {
            let h = OptHeader { option, len };
            prop_assert_eq!(OptHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn opt_reply_round_trips(option in any::<u32>(), reply in any::<u32>(),
                                 payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut out = Vec::new();
            encode_opt_reply(&mut out, option, reply, &payload);
            let h = OptReplyHeader::decode(&out).unwrap();
            prop_assert_eq!(h, OptReplyHeader { option, reply, len: payload.len() as u32 });
            prop_assert_eq!(&out[OPT_REPLY_HEADER_LEN..], &payload[..]);
        }

        #[test]
        fn info_request_round_trips(name in proptest::collection::vec(any::<u8>(), 0..300),
                                    requests in proptest::collection::vec(any::<u16>(), 0..20)) {
            let r = InfoRequest { name: &name, requests };
            let b = r.encode();
            prop_assert_eq!(InfoRequest::decode(&b).unwrap(), r);
        }

        #[test]
        fn info_request_with_a_wrong_length_is_refused(
            name in proptest::collection::vec(any::<u8>(), 0..30),
            extra in 1usize..4,
        ) {
            let mut b = InfoRequest { name: &name, requests: vec![1, 3] }.encode();
            b.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(InfoRequest::decode(&b).is_err());
            b.truncate(b.len() - extra - 1);
            prop_assert!(InfoRequest::decode(&b).is_err());
        }
    }

    #[test]
    fn oversize_name_is_refused_before_reading_it() {
        let mut b = (STRING_BYTES_MAX as u32 + 1).to_be_bytes().to_vec();
        b.extend_from_slice(&[0, 0]);
        assert!(matches!(InfoRequest::decode(&b), Err(DecodeError::TooLong { .. })));
        let huge = u32::MAX.to_be_bytes();
        assert!(InfoRequest::decode(&huge).is_err());
    }
}
