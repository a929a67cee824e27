//! The 40-byte reply header.
//!
//! ```text
//!  0 magic        u32  "MLRP"
//!  4 status       u16  `Status`
//!  6 flags        u16  must be 0
//!  8 tag          u32  the request's tag
//! 12 payload_len  u32
//! 16 seq          u64  the request's seq
//! 24 value        u64  opcode-specific result (slab id, slab size)
//! 32 payload_crc  u32  CRC32C of the payload (of a sealed READ's sidecars
//!                      only), 0 if there is none
//! 36 header_crc   u32  CRC32C of bytes 0..36
//! ```

use super::{le_u16, le_u32, le_u64, limits, FrameError, Status};

pub const REP_HEADER_LEN: usize = 40;
const MAGIC: u32 = u32::from_le_bytes(*b"MLRP");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepHeader {
    pub status: Status,
    pub tag: u32,
    pub payload_len: u32,
    pub seq: u64,
    pub value: u64,
    pub payload_crc: u32,
}

impl RepHeader {
    /// A reply with no payload.
    pub fn status(status: Status, tag: u32, seq: u64) -> Self {
        RepHeader { status, tag, payload_len: 0, seq, value: 0, payload_crc: 0 }
    }

    pub fn encode(&self) -> [u8; REP_HEADER_LEN] {
        let mut b = [0u8; REP_HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&(self.status as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        b[32..36].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        if b.len() < REP_HEADER_LEN {
            return Err(FrameError::Truncated { got: b.len(), need: REP_HEADER_LEN });
        }
        let magic = le_u32(b, 0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic as u64));
        }
        let (carried, computed) = (le_u32(b, 36), crc32c::crc32c(&b[..36]));
        if carried != computed {
            return Err(FrameError::BadHeaderCrc { carried, computed });
        }
        let flags = le_u16(b, 6);
        if flags != 0 {
            return Err(FrameError::BadFlags(flags as u32));
        }
        let payload_len = le_u32(b, 12);
        if payload_len > limits::REPLY_PAYLOAD_BYTES_MAX {
            let (got, limit) = (payload_len as u64, limits::REPLY_PAYLOAD_BYTES_MAX as u64);
            return Err(FrameError::TooLarge { what: "reply payload_len", got, limit });
        }
        Ok(RepHeader {
            status: Status::from_u16(le_u16(b, 4)),
            tag: le_u32(b, 8),
            payload_len,
            seq: le_u64(b, 16),
            value: le_u64(b, 24),
            payload_crc: le_u32(b, 32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STATUSES: [Status; 4] = [Status::Ok, Status::NoSpace, Status::Corrupt, Status::BadFlags];

    proptest! {
        #[test]
        fn round_trips(s in 0usize..4, tag: u32, len in 0..=limits::REPLY_PAYLOAD_BYTES_MAX,
                       seq: u64, value: u64, crc: u32) {
            let h = RepHeader { status: STATUSES[s], tag, payload_len: len, seq, value, payload_crc: crc };
            prop_assert_eq!(RepHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn any_flipped_bit_is_caught(tag: u32, bit in 0usize..(REP_HEADER_LEN * 8)) {
            let mut b = RepHeader::status(Status::Ok, tag, 7).encode();
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(RepHeader::decode(&b).is_err());
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = RepHeader::decode(&b);
        }
    }
}
