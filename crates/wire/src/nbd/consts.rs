//! Numbers of the NBD protocol: magics, flag bits, option, reply, info,
//! command and error codes. Names follow `doc/proto.md` without the `NBD_`
//! prefix. Option and reply codes stay plain integers because an unknown
//! one must be echoed back, not rejected at decode.

use crate::wire_enum::wire_enum;

/// `NBDMAGIC`: first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic, also the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every fixed-newstyle option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// The longest string (export name, description, message) the protocol allows.
pub const STRING_BYTES_MAX: usize = 4096;
/// Most queries one `OPT_LIST_META_CONTEXT` or `OPT_SET_META_CONTEXT` may
/// carry. The protocol sets no limit; a client asks for a handful.
pub const META_QUERIES_MAX: u32 = 128;

/// The metadata context of allocation: which ranges are holes, which read
/// as zero (`state::*`).
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Handshake flags (server, 16 bits).
pub mod handshake_flags {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits), the answer to the handshake flags.
pub mod client_flags {
    pub const C_FIXED_NEWSTYLE: u32 = 1 << 0;
    pub const C_NO_ZEROES: u32 = 1 << 1;
    /// Every bit a client may set.
    pub const KNOWN: u32 = C_FIXED_NEWSTYLE | C_NO_ZEROES;
}

/// Transmission flags (16 bits), sent per export.
pub mod tx_flags {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes (`NBD_OPT_*`).
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const PEEK_EXPORT: u32 = 4;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types (`NBD_REP_*`). Errors have bit 31 set.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const FLAG_ERROR: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = FLAG_ERROR | 1;
    pub const ERR_POLICY: u32 = FLAG_ERROR | 2;
    pub const ERR_INVALID: u32 = FLAG_ERROR | 3;
    pub const ERR_PLATFORM: u32 = FLAG_ERROR | 4;
    pub const ERR_TLS_REQD: u32 = FLAG_ERROR | 5;
    pub const ERR_UNKNOWN: u32 = FLAG_ERROR | 6;
    pub const ERR_SHUTDOWN: u32 = FLAG_ERROR | 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = FLAG_ERROR | 8;
    pub const ERR_TOO_BIG: u32 = FLAG_ERROR | 9;
}

/// Information types in `NBD_REP_INFO` and in `OPT_INFO`/`OPT_GO` requests.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Command flags (16 bits) of a transmission request.
pub mod cmd_flags {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

/// Structured reply chunk flags.
pub mod reply_flags {
    pub const DONE: u16 = 1 << 0;
}

/// Structured reply chunk types. Error chunks have bit 15 set.
pub mod chunk_type {
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    pub const FLAG_ERROR: u16 = 1 << 15;
    pub const ERROR: u16 = FLAG_ERROR | 1;
    pub const ERROR_OFFSET: u16 = FLAG_ERROR | 2;
}

/// Extent flags of the `base:allocation` context in a block status chunk.
pub mod state {
    /// Not allocated in the backend.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as all zeroes.
    pub const ZERO: u32 = 1 << 1;
}

wire_enum! {
/// Transmission commands (`NBD_CMD_*`).
pub enum Command: u16 {
    Read = 0,
    Write = 1,
    Disc = 2,
    Flush = 3,
    Trim = 4,
    Cache = 5,
    WriteZeroes = 6,
    BlockStatus = 7,
}
}

wire_enum! {
/// The error values a reply may carry: the protocol allows exactly these.
pub enum Errno: u32 {
    Perm = 1,
    Io = 5,
    NoMem = 12,
    Inval = 22,
    NoSpc = 28,
    Overflow = 75,
    NotSup = 95,
    Shutdown = 108,
}
}

impl Errno {
    /// A short human string, sent in structured error chunks.
    pub fn describe(self) -> &'static str {
        match self {
            Errno::Perm => "operation not permitted",
            Errno::Io => "input/output error",
            Errno::NoMem => "cannot allocate memory",
            Errno::Inval => "invalid argument",
            Errno::NoSpc => "no space left on device",
            Errno::Overflow => "value too large",
            Errno::NotSup => "operation not supported",
            Errno::Shutdown => "server is shutting down",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_their_names() {
        assert_eq!(&NBDMAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    }

    #[test]
    fn codes_round_trip() {
        for v in 0..=u16::MAX {
            if let Some(c) = Command::from_wire(v) {
                assert_eq!(c as u16, v);
            }
        }
        for v in 0..200u32 {
            if let Some(e) = Errno::from_wire(v) {
                assert_eq!(e as u32, v);
            }
        }
    }
}
