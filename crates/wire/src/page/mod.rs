//! The page protocol; `docs/protocol.md` is its reference.
//!
//! Fixed little-endian headers, a CRC32C over every header and payload, a
//! request tag for many requests in flight answered in any order, and a
//! per-session sequence number so that a later version can resume a session
//! exactly once across reconnects.

mod auth;
mod codes;
mod error;
mod hello;
mod reply;
mod request;
mod stat;

pub use auth::{client_mac, server_mac, verify_mac, Key, KEY_LEN, MAC_LEN, NONCE_LEN};
pub use codes::{Opcode, Status};
pub use error::FrameError;
pub use hello::{Auth, Challenge, Hello, Welcome};
pub use reply::{RepHeader, REP_HEADER_LEN};
pub use request::{ReqHeader, REQ_HEADER_LEN};
pub use stat::StatReply;

/// Bytes in a page.
pub const PAGE_SIZE: usize = 4096;
/// The tag of a reply to a frame the server could not decode; the server
/// closes the connection after it. Clients never use it for a request.
pub const FATAL_TAG: u32 = u32::MAX;
/// The one protocol version this build speaks. Version 2: a sealed READ's
/// payload CRC covers its sidecars only (version 1 covered the pages too,
/// which their AEAD tags already check).
pub const VERSION: u16 = 2;

/// Request flag: the pages carry a sidecar of [`SIDECAR_LEN`] bytes each
/// (an AEAD tag the donor keeps for the borrower). On OPEN_SLAB it makes a
/// slab that keeps sidecars; on WRITE the payload is one sidecar per page,
/// then the pages; on READ the reply is the same, and its payload CRC
/// covers the sidecars only: each page's tag authenticates it, and the
/// borrower checks every tag. Valid only on those
/// three opcodes, and READ/WRITE only on a slab opened with it.
pub const FLAG_SEALED: u8 = 1;
/// Bytes of one page's sidecar.
pub const SIDECAR_LEN: usize = 16;

/// Hard limits of the protocol. A server may advertise smaller ones in its
/// `Welcome`; it never accepts larger.
pub mod limits {
    /// Pages in one READ/WRITE/READV/WRITEV (1 MiB of data).
    pub const BATCH_PAGES_MAX: u32 = 256;
    /// Requests a client may have outstanding on one connection.
    pub const INFLIGHT_MAX: u32 = 128;
    /// Slabs one borrower may hold open on one donor.
    pub const SLABS_PER_BORROWER_MAX: u32 = 1024;
    /// The largest payload any request can carry: a full sealed WRITE
    /// (a WRITEV's 8 bytes of index a page are fewer).
    pub const PAYLOAD_BYTES_MAX: u32 = BATCH_PAGES_MAX * SEALED_PAGE_BYTES;
    /// The largest reply payload: a full sealed READ.
    pub const REPLY_PAYLOAD_BYTES_MAX: u32 = BATCH_PAGES_MAX * SEALED_PAGE_BYTES;
    /// A page and its sidecar.
    const SEALED_PAGE_BYTES: u32 = (super::PAGE_SIZE + super::SIDECAR_LEN) as u32;
}

/// Read a little-endian integer at `at` from a slice the caller has already
/// sized; out-of-bounds is a bug in this crate, not bad input.
fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("sized by caller"))
}
fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("sized by caller"))
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("sized by caller"))
}

/// CRC32C of a payload, as carried in request and reply headers.
pub fn payload_crc(payload: &[u8]) -> u32 {
    crc32c::crc32c(payload)
}

/// CRC32C of a list of buffers, as if concatenated (a scatter/gather payload).
pub fn payload_crc_iov<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    parts.into_iter().fold(0, crc32c::crc32c_append)
}
