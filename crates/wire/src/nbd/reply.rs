//! Transmission replies: the 16-byte simple reply and structured chunks.
//!
//! ```text
//! simple:     SIMPLE_REPLY_MAGIC u32 | error u32 | cookie u64 | (READ data)
//! structured: STRUCTURED_REPLY_MAGIC u32 | flags u16 | type u16 | cookie u64
//!             | length u32 | payload[length]
//!   OFFSET_DATA payload: offset u64 | data
//!   ERROR payload:       error u32 | message length u16 | message
//!   BLOCK_STATUS payload: context id u32 | n x (length u32 | flags u32)
//! ```

use super::error::need;
use super::{be_u16, be_u32, be_u64, chunk_type, reply_flags, DecodeError};
use super::{SIMPLE_REPLY_MAGIC, STRING_BYTES_MAX, STRUCTURED_REPLY_MAGIC};

pub const SIMPLE_REPLY_LEN: usize = 16;
pub const CHUNK_HEADER_LEN: usize = 20;
/// A chunk header plus the 8-byte offset that starts an OFFSET_DATA payload.
pub const OFFSET_DATA_HEADER_LEN: usize = CHUNK_HEADER_LEN + 8;
/// Fixed part of an ERROR chunk payload: error and message length.
const ERROR_FIXED_LEN: usize = 6;
/// The context id that starts a BLOCK_STATUS payload.
const BLOCK_STATUS_FIXED_LEN: usize = 4;
/// One extent descriptor in a BLOCK_STATUS payload.
pub const EXTENT_LEN: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    /// 0 for success, else an `Errno` value.
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_LEN] {
        let mut b = [0u8; SIMPLE_REPLY_LEN];
        b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.error.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("simple reply", b, SIMPLE_REPLY_LEN)?;
        let magic = be_u32(b, 0);
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(DecodeError::BadMagic { what: "simple reply", got: magic as u64 });
        }
        Ok(SimpleReply { error: be_u32(b, 4), cookie: be_u64(b, 8) })
    }
}

/// The header of one structured reply chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub len: u32,
}

impl ChunkHeader {
    pub fn is_done(&self) -> bool {
        self.flags & reply_flags::DONE != 0
    }

    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        need("chunk header", b, CHUNK_HEADER_LEN)?;
        let magic = be_u32(b, 0);
        if magic != STRUCTURED_REPLY_MAGIC {
            return Err(DecodeError::BadMagic { what: "chunk header", got: magic as u64 });
        }
        Ok(ChunkHeader {
            flags: be_u16(b, 4),
            kind: be_u16(b, 6),
            cookie: be_u64(b, 8),
            len: be_u32(b, 16),
        })
    }
}

fn done_flag(done: bool) -> u16 {
    if done {
        reply_flags::DONE
    } else {
        0
    }
}

/// Chunk header and offset for an OFFSET_DATA chunk of `data_len` bytes.
/// `data_len` must leave room for the offset in the 32-bit length.
pub fn encode_offset_data_header(
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) -> [u8; OFFSET_DATA_HEADER_LEN] {
    let len = data_len.checked_add(8).expect("OFFSET_DATA chunk over 4 GiB");
    let h = ChunkHeader { flags: done_flag(done), kind: chunk_type::OFFSET_DATA, cookie, len };
    let mut b = [0u8; OFFSET_DATA_HEADER_LEN];
    b[..CHUNK_HEADER_LEN].copy_from_slice(&h.encode());
    b[CHUNK_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// The NONE chunk that ends a structured reply with nothing more to say.
pub fn encode_none_chunk(cookie: u64) -> [u8; CHUNK_HEADER_LEN] {
    ChunkHeader { flags: reply_flags::DONE, kind: chunk_type::NONE, cookie, len: 0 }.encode()
}

/// Append an ERROR chunk. The message is cut to the protocol's string limit.
pub fn encode_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &[u8], done: bool) {
    let message = &message[..message.len().min(STRING_BYTES_MAX)];
    let len = (ERROR_FIXED_LEN + message.len()) as u32;
    let h = ChunkHeader { flags: done_flag(done), kind: chunk_type::ERROR, cookie, len };
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
}

/// Split an error chunk's payload (ERROR or ERROR_OFFSET) into error and message.
pub fn decode_error_chunk(payload: &[u8]) -> Result<(u32, &[u8]), DecodeError> {
    need("error chunk", payload, ERROR_FIXED_LEN)?;
    let msg_len = be_u16(payload, 4) as usize;
    let room = payload.len() - ERROR_FIXED_LEN;
    if msg_len > room {
        let (got, limit) = (msg_len as u64, room as u64);
        return Err(DecodeError::TooLong { what: "error chunk message", got, limit });
    }
    Ok((be_u32(payload, 0), &payload[ERROR_FIXED_LEN..ERROR_FIXED_LEN + msg_len]))
}

/// One extent of a BLOCK_STATUS chunk: `len_bytes` bytes (never 0) in the
/// state `flags` (for `base:allocation`, `state::*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub len_bytes: u32,
    pub flags: u32,
}

/// Append a BLOCK_STATUS chunk describing consecutive extents for one
/// metadata context. Callers bound `extents` far below the 32-bit length.
pub fn encode_block_status_chunk(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    extents: &[Extent],
    done: bool,
) {
    let len = u32::try_from(BLOCK_STATUS_FIXED_LEN + EXTENT_LEN * extents.len())
        .expect("BLOCK_STATUS chunk over 4 GiB");
    let h = ChunkHeader { flags: done_flag(done), kind: chunk_type::BLOCK_STATUS, cookie, len };
    out.reserve(CHUNK_HEADER_LEN + len as usize);
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(&context_id.to_be_bytes());
    for e in extents {
        out.extend_from_slice(&e.len_bytes.to_be_bytes());
        out.extend_from_slice(&e.flags.to_be_bytes());
    }
}

/// Split a BLOCK_STATUS payload into its context id and extents. The
/// protocol requires at least one extent.
pub fn decode_block_status(payload: &[u8]) -> Result<(u32, Vec<Extent>), DecodeError> {
    need("block status chunk", payload, BLOCK_STATUS_FIXED_LEN + EXTENT_LEN)?;
    let descriptors = &payload[BLOCK_STATUS_FIXED_LEN..];
    if !descriptors.len().is_multiple_of(EXTENT_LEN) {
        let got = payload.len() as u64;
        let expected =
            (BLOCK_STATUS_FIXED_LEN + descriptors.len() / EXTENT_LEN * EXTENT_LEN) as u64;
        return Err(DecodeError::BadLength { what: "block status chunk", got, expected });
    }
    let extents = descriptors
        .chunks_exact(EXTENT_LEN)
        .map(|d| Extent { len_bytes: be_u32(d, 0), flags: be_u32(d, 4) })
        .collect();
    Ok((be_u32(payload, 0), extents))
}

/// Split an OFFSET_DATA payload into offset and data.
pub fn decode_offset_data(payload: &[u8]) -> Result<(u64, &[u8]), DecodeError> {
    need("offset data chunk", payload, 9)?;
    Ok((be_u64(payload, 0), &payload[8..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn simple_reply_round_trips(error in any::<u32>(), cookie in any::<u64>()) {
            let r = SimpleReply { error, cookie };
            prop_assert_eq!(SimpleReply::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn chunk_header_round_trips(flags in any::<u16>(), kind in any::<u16>(),
                                    cookie in any::<u64>(), len in any::<u32>()) {
            let h = ChunkHeader { flags, kind, cookie, len };
            prop_assert_eq!(ChunkHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn offset_data_round_trips(cookie in any::<u64>(), offset in any::<u64>(),
                                   data in proptest::collection::vec(any::<u8>(), 1..100),
                                   done in any::<bool>()) {
            let mut b = encode_offset_data_header(cookie, offset, data.len() as u32, done).to_vec();
            b.extend_from_slice(&data);
            let h = ChunkHeader::decode(&b).unwrap();
            prop_assert_eq!((h.kind, h.cookie, h.is_done()), (chunk_type::OFFSET_DATA, cookie, done));
            prop_assert_eq!(h.len as usize, b.len() - CHUNK_HEADER_LEN);
            let (o, d) = decode_offset_data(&b[CHUNK_HEADER_LEN..]).unwrap();
            prop_assert_eq!((o, d), (offset, &data[..]));
        }

        #[test]
        fn error_chunk_round_trips(cookie in any::<u64>(), error in 1u32..,
                                   msg in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let mut b = Vec::new();
            encode_error_chunk(&mut b, cookie, error, &msg, true);
            let h = ChunkHeader::decode(&b).unwrap();
            prop_assert_eq!((h.kind, h.cookie, h.is_done()), (chunk_type::ERROR, cookie, true));
            prop_assert_eq!(h.len as usize, b.len() - CHUNK_HEADER_LEN);
            let (e, m) = decode_error_chunk(&b[CHUNK_HEADER_LEN..]).unwrap();
            prop_assert_eq!(e, error);
            prop_assert_eq!(m, &msg[..msg.len().min(STRING_BYTES_MAX)]);
        }
    }

    proptest! {
        #[test]
        fn block_status_round_trips(cookie in any::<u64>(), id in any::<u32>(),
                                    raw in proptest::collection::vec((1u32.., any::<u32>()), 1..50),
                                    done in any::<bool>()) {
            let extents: Vec<Extent> =
                raw.iter().map(|&(len_bytes, flags)| Extent { len_bytes, flags }).collect();
            let mut b = Vec::new();
            encode_block_status_chunk(&mut b, cookie, id, &extents, done);
            let h = ChunkHeader::decode(&b).unwrap();
            prop_assert_eq!((h.kind, h.cookie, h.is_done()), (chunk_type::BLOCK_STATUS, cookie, done));
            prop_assert_eq!(h.len as usize, b.len() - CHUNK_HEADER_LEN);
            prop_assert_eq!(decode_block_status(&b[CHUNK_HEADER_LEN..]).unwrap(), (id, extents));
        }
    }

    #[test]
    fn block_status_without_extents_or_with_a_partial_one_is_refused() {
        assert!(decode_block_status(&[0, 0, 0, 1]).is_err());
        assert!(decode_block_status(&[0, 0, 0, 1, 0, 0, 16, 0, 0, 0, 0]).is_err());
        let mut twelve_and_a_bit = vec![0u8; 4 + EXTENT_LEN + 3];
        twelve_and_a_bit[3] = 1;
        assert!(decode_block_status(&twelve_and_a_bit).is_err());
    }

    #[test]
    fn none_chunk_is_final_and_empty() {
        let h = ChunkHeader::decode(&encode_none_chunk(7)).unwrap();
        assert_eq!((h.kind, h.len, h.cookie, h.is_done()), (chunk_type::NONE, 0, 7, true));
    }

    #[test]
    fn error_message_longer_than_its_chunk_is_refused() {
        assert!(decode_error_chunk(&[0, 0, 0, 22, 0, 5, b'a']).is_err());
        assert!(decode_offset_data(&[0; 8]).is_err());
    }
}
