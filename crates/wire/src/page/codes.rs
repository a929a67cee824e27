//! Numbered opcodes and status codes. Numbers are part of the wire format:
//! never renumber, only add.

use crate::wire_enum::wire_enum;

wire_enum! {
/// What a request asks for.
pub enum Opcode: u8 {
    /// No operation; measures a round trip.
    Ping = 1,
    /// Open a new slab of `page` pages; the reply's `value` is its id.
    OpenSlab = 2,
    /// Close slab `slab`, freeing its memory.
    CloseSlab = 3,
    /// Read pages `page..page+count` of `slab`.
    Read = 4,
    /// Write pages `page..page+count` of `slab` from the payload.
    Write = 5,
    /// Read `count` scattered pages named by a list of u64 indices.
    ReadV = 6,
    /// Write `count` scattered pages: u64 indices, then the page data.
    WriteV = 7,
    /// Pages `page..page+count` read as zero afterwards; memory is freed.
    Discard = 8,
    /// Make completed writes to `slab` durable (no-op for RAM slabs).
    Flush = 9,
    /// Donor and borrower statistics; the reply carries a `StatReply`.
    Stat = 10,
    /// Size in pages of slab `slab` in the reply's `value` (re-attach check).
    SlabInfo = 11,
    /// Once this borrower's last connection ends, free its slabs within
    /// `count` seconds (never later than the donor's own grace) instead of
    /// after the donor's grace. A borrower that is exiting says 0, so the
    /// next one finds the memory free at once.
    Linger = 12,
}
}

wire_enum! {
/// The outcome of a request (or of the handshake). `Ok` is 0.
pub enum Status: u16 {
    Ok = 0,
    BadMagic = 1,
    BadHeaderCrc = 2,
    BadPayloadCrc = 3,
    UnknownOpcode = 4,
    BadLength = 5,
    OutOfRange = 6,
    NoSuchSlab = 7,
    NoSpace = 8,
    TooManySlabs = 9,
    BatchTooLarge = 10,
    IoError = 11,
    Corrupt = 12,
    AuthFailed = 13,
    VersionUnsupported = 14,
    TooManyConnections = 15,
    ShuttingDown = 16,
    BadFlags = 17,
    /// A resume named a session the donor does not have (expired, or the
    /// donor restarted).
    NoSession = 18,
    /// A request's sequence number skipped ahead of its session.
    BadSeq = 19,
    /// A status number this build does not know (from a newer peer).
    Unknown = 0xffff,
}
}

impl Status {
    /// Decode a status; one from a newer peer reads as `Unknown`.
    pub fn from_u16(v: u16) -> Self {
        Status::from_wire(v).unwrap_or(Status::Unknown)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({})", self, *self as u16)
    }
}
