//! The STAT reply payload, 32 bytes.

use super::{le_u32, le_u64, FrameError};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatReply {
    /// Pages the donor lends in all.
    pub lend_pages: u64,
    /// Pages not yet promised to any slab.
    pub free_pages: u64,
    /// Slabs this borrower holds on the donor.
    pub borrower_slabs: u32,
    /// Pages in this borrower's slabs.
    pub borrower_pages: u64,
}

impl StatReply {
    pub const LEN: usize = 32;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.lend_pages.to_le_bytes());
        b[8..16].copy_from_slice(&self.free_pages.to_le_bytes());
        b[16..20].copy_from_slice(&self.borrower_slabs.to_le_bytes());
        b[24..32].copy_from_slice(&self.borrower_pages.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        if b.len() != Self::LEN {
            return Err(FrameError::BadLength {
                what: "stat reply",
                got: b.len() as u64,
                expected: Self::LEN as u64,
            });
        }
        Ok(StatReply {
            lend_pages: le_u64(b, 0),
            free_pages: le_u64(b, 8),
            borrower_slabs: le_u32(b, 16),
            borrower_pages: le_u64(b, 24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(lend: u64, free: u64, slabs: u32, pages: u64) {
            let s = StatReply { lend_pages: lend, free_pages: free, borrower_slabs: slabs, borrower_pages: pages };
            prop_assert_eq!(StatReply::decode(&s.encode()).unwrap(), s);
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = StatReply::decode(&b);
        }
    }
}
