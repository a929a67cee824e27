//! The NBD protocol (fixed newstyle handshake and transmission phase), as
//! `doc/proto.md` of NetworkBlockDevice/nbd describes it. Byte codecs only:
//! every decoder takes a slice, checks its length first, and returns a
//! `DecodeError`; encoders cannot fail on values of their types. All
//! integers are big-endian on the wire.

mod consts;
mod error;
mod export_info;
mod handshake;
mod meta;
mod option;
mod reply;
mod request;

#[cfg(test)]
mod fuzz;

pub use consts::*;
pub use error::DecodeError;
pub use export_info::{
    decode_rep_server, encode_rep_server, Info, INFO_BLOCK_SIZE_LEN, INFO_EXPORT_LEN,
};
pub use handshake::{decode_export_name_reply, encode_export_name_reply, ClientFlags, Greeting};
pub use handshake::{
    CLIENT_FLAGS_LEN, EXPORT_NAME_PADDING_LEN, EXPORT_NAME_REPLY_LEN, GREETING_LEN,
};
pub use meta::{decode_rep_meta_context, encode_rep_meta_context, MetaContextRequest};
pub use option::{encode_opt_reply, InfoRequest, OptHeader, OptReplyHeader};
pub use option::{OPT_HEADER_LEN, OPT_REPLY_HEADER_LEN};
pub use reply::{decode_block_status, encode_block_status_chunk, Extent, EXTENT_LEN};
pub use reply::{decode_error_chunk, decode_offset_data, encode_error_chunk, encode_none_chunk};
pub use reply::{encode_offset_data_header, ChunkHeader, SimpleReply};
pub use reply::{CHUNK_HEADER_LEN, OFFSET_DATA_HEADER_LEN, SIMPLE_REPLY_LEN};
pub use request::{Request, REQUEST_LEN};

/// Read a big-endian integer at `at` from a slice the caller has already
/// sized; out of bounds is a bug in this module, not bad input.
fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("sized by caller"))
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("sized by caller"))
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("sized by caller"))
}
