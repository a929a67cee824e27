//! The 48-byte request header.
//!
//! ```text
//!  0 magic        u32  "MLRQ"
//!  4 opcode       u8
//!  5 flags        u8   FLAG_SEALED on OPEN_SLAB/READ/WRITE, else 0
//!  6 reserved     u16  must be 0
//!  8 tag          u32  chosen by the client, echoed in the reply
//! 12 count        u32  pages (or page indices for READV/WRITEV)
//! 16 seq          u64  per-session sequence number
//! 24 slab         u32
//! 28 payload_len  u32
//! 32 page         u64  first page (READ/WRITE/DISCARD) or slab size (OPEN_SLAB)
//! 40 payload_crc  u32  CRC32C of the payload, 0 if there is none
//! 44 header_crc   u32  CRC32C of bytes 0..44
//! ```

use super::SIDECAR_LEN;
use super::{le_u16, le_u32, le_u64, limits, FrameError, Opcode, FLAG_SEALED, PAGE_SIZE};

pub const REQ_HEADER_LEN: usize = 48;
const MAGIC: u32 = u32::from_le_bytes(*b"MLRQ");

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReqHeader {
    /// Raw opcode: an unknown one is answered, not a reason to drop the stream.
    pub opcode: u8,
    pub flags: u8,
    pub tag: u32,
    pub count: u32,
    pub seq: u64,
    pub slab: u32,
    pub payload_len: u32,
    pub page: u64,
    pub payload_crc: u32,
}

impl ReqHeader {
    pub fn new(op: Opcode, tag: u32) -> Self {
        ReqHeader { opcode: op as u8, tag, ..Default::default() }
    }

    pub fn encode(&self) -> [u8; REQ_HEADER_LEN] {
        let mut b = [0u8; REQ_HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.opcode;
        b[5] = self.flags;
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.slab.to_le_bytes());
        b[28..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.page.to_le_bytes());
        b[40..44].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode and check what can be checked without knowing the opcode:
    /// magic, header CRC, reserved bits, and the payload bound. After an error
    /// here the stream cannot be trusted.
    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        if b.len() < REQ_HEADER_LEN {
            return Err(FrameError::Truncated { got: b.len(), need: REQ_HEADER_LEN });
        }
        let magic = le_u32(b, 0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic as u64));
        }
        let (carried, computed) = (le_u32(b, 44), crc32c::crc32c(&b[..44]));
        if carried != computed {
            return Err(FrameError::BadHeaderCrc { carried, computed });
        }
        let h = ReqHeader {
            opcode: b[4],
            flags: b[5],
            tag: le_u32(b, 8),
            count: le_u32(b, 12),
            seq: le_u64(b, 16),
            slab: le_u32(b, 24),
            payload_len: le_u32(b, 28),
            page: le_u64(b, 32),
            payload_crc: le_u32(b, 40),
        };
        let reserved = le_u16(b, 6);
        if reserved != 0 {
            return Err(FrameError::BadFlags(reserved as u32));
        }
        if h.payload_len > limits::PAYLOAD_BYTES_MAX {
            let (got, limit) = (h.payload_len as u64, limits::PAYLOAD_BYTES_MAX as u64);
            return Err(FrameError::TooLarge { what: "payload_len", got, limit });
        }
        Ok(h)
    }

    /// Check the fields against the opcode. The payload (already bounded by
    /// `decode`) can be skipped after an error here, so the stream survives.
    pub fn validate(&self, batch_pages_max: u32) -> Result<Opcode, FrameError> {
        let op = Opcode::from_wire(self.opcode).ok_or(FrameError::UnknownOpcode(self.opcode))?;
        let sealable = matches!(op, Opcode::OpenSlab | Opcode::Read | Opcode::Write);
        if self.flags & !FLAG_SEALED != 0 || (self.sealed() && !sealable) {
            return Err(FrameError::BadFlags(self.flags as u32));
        }
        let batched = matches!(op, Opcode::Read | Opcode::Write | Opcode::ReadV | Opcode::WriteV);
        if batched && (self.count == 0 || self.count > batch_pages_max) {
            let (got, limit) = (self.count as u64, batch_pages_max as u64);
            return Err(FrameError::BadBatch { got, limit });
        }
        let expected = Self::expected_payload(op, self.count, self.sealed());
        if self.payload_len as u64 != expected {
            let got = self.payload_len as u64;
            return Err(FrameError::BadLength { what: "payload_len", got, expected });
        }
        Ok(op)
    }

    /// Whether the request carries (or asks for) sidecars.
    pub fn sealed(&self) -> bool {
        self.flags & FLAG_SEALED != 0
    }

    /// Payload bytes that `op` with `count` must carry.
    pub fn expected_payload(op: Opcode, count: u32, sealed: bool) -> u64 {
        let count = count as u64;
        match op {
            Opcode::Write if sealed => count * (PAGE_SIZE + SIDECAR_LEN) as u64,
            Opcode::Write => count * PAGE_SIZE as u64,
            Opcode::ReadV => count * 8,
            Opcode::WriteV => count * (8 + PAGE_SIZE as u64),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_header() -> impl Strategy<Value = ReqHeader> {
        let max = limits::PAYLOAD_BYTES_MAX;
        (
            any::<u8>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            0..=max,
            any::<u64>(),
            any::<u32>(),
        )
            .prop_map(|(opcode, tag, count, seq, slab, payload_len, page, payload_crc)| {
                ReqHeader {
                    opcode,
                    flags: 0,
                    tag,
                    count,
                    seq,
                    slab,
                    payload_len,
                    page,
                    payload_crc,
                }
            })
    }

    proptest! {
        #[test]
        fn round_trips(h in any_header()) {
            prop_assert_eq!(ReqHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn any_flipped_bit_is_caught(h in any_header(), bit in 0usize..(REQ_HEADER_LEN * 8)) {
            let mut b = h.encode();
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(ReqHeader::decode(&b).is_err());
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(h) = ReqHeader::decode(&b) {
                let _ = h.validate(limits::BATCH_PAGES_MAX);
            }
        }
    }

    #[test]
    fn validate_checks_count_and_payload() {
        let mut h = ReqHeader::new(Opcode::Write, 1);
        h.count = 2;
        h.payload_len = 2 * 4096;
        assert_eq!(h.validate(256), Ok(Opcode::Write));
        h.payload_len = 4096;
        assert!(matches!(h.validate(256), Err(FrameError::BadLength { .. })));
        h.count = 257;
        assert!(matches!(h.validate(256), Err(FrameError::BadBatch { .. })));
        h.count = 0;
        assert!(matches!(h.validate(256), Err(FrameError::BadBatch { .. })));
        let unknown = ReqHeader { opcode: 200, ..h };
        assert_eq!(unknown.validate(256), Err(FrameError::UnknownOpcode(200)));
    }

    #[test]
    fn sealed_is_only_for_open_read_and_write_and_sizes_the_payload() {
        let mut h = ReqHeader { count: 2, flags: FLAG_SEALED, ..ReqHeader::new(Opcode::Write, 1) };
        h.payload_len = 2 * 4096;
        assert!(matches!(h.validate(256), Err(FrameError::BadLength { .. })));
        h.payload_len = 2 * (4096 + 16);
        assert_eq!(h.validate(256), Ok(Opcode::Write));
        let read = ReqHeader { payload_len: 0, opcode: Opcode::Read as u8, ..h };
        assert_eq!(read.validate(256), Ok(Opcode::Read));
        let open = ReqHeader { count: 0, ..read };
        assert_eq!(
            ReqHeader { opcode: Opcode::OpenSlab as u8, ..open }.validate(256),
            Ok(Opcode::OpenSlab)
        );
        for op in [Opcode::ReadV, Opcode::Discard, Opcode::Ping] {
            let bad = ReqHeader { opcode: op as u8, ..open };
            assert_eq!(bad.validate(256), Err(FrameError::BadFlags(1)), "{op:?}");
        }
        let unknown_flag = ReqHeader { flags: 2, ..read };
        assert_eq!(unknown_flag.validate(256), Err(FrameError::BadFlags(2)));
        // A full sealed WRITE fits the payload bound.
        let full = 256 * (4096 + 16);
        assert!(full <= limits::PAYLOAD_BYTES_MAX);
    }

    #[test]
    fn oversize_payload_is_refused_at_decode() {
        let h = ReqHeader {
            payload_len: limits::PAYLOAD_BYTES_MAX + 1,
            ..ReqHeader::new(Opcode::Write, 1)
        };
        assert!(matches!(ReqHeader::decode(&h.encode()), Err(FrameError::TooLarge { .. })));
    }
}
