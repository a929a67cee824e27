use thiserror::Error;

/// Bytes that are not a well-formed NBD message. Whether the stream can go on
/// after one is the caller's decision: a bad magic cannot be resynchronised,
/// a bad option payload can (its length was in the header).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("{what} truncated: {got} of {need} bytes")]
    Truncated { what: &'static str, got: usize, need: usize },
    #[error("{what}: bad magic {got:#x}")]
    BadMagic { what: &'static str, got: u64 },
    #[error("client flags {0:#010x} set bits the server did not offer")]
    UnknownClientFlags(u32),
    #[error("{what}: length {got}, expected {expected}")]
    BadLength { what: &'static str, got: u64, expected: u64 },
    #[error("{what}: {got} bytes is more than the limit of {limit}")]
    TooLong { what: &'static str, got: u64, limit: u64 },
}

/// Fail with `Truncated` unless `b` holds at least `need` bytes.
pub(crate) fn need(what: &'static str, b: &[u8], need: usize) -> Result<(), DecodeError> {
    if b.len() < need {
        return Err(DecodeError::Truncated { what, got: b.len(), need });
    }
    Ok(())
}
