use thiserror::Error;

/// A control datagram that cannot be decoded (or a message that cannot be
/// encoded). Receivers count and drop; nothing here is fatal.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CtrlError {
    #[error("datagram of {got} bytes: shorter than the {need}-byte minimum")]
    TooShort { got: usize, need: usize },
    #[error("datagram of {got} bytes: more than the {limit}-byte limit")]
    TooLong { got: usize, limit: usize },
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("version {0} is not supported (this build speaks 1)")]
    Version(u8),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("reserved field is {0:#x}, must be zero")]
    BadFlags(u32),
    #[error("body_len {declared} does not match the datagram's {actual} body bytes")]
    BodyLength { declared: usize, actual: usize },
    #[error("MAC does not verify (wrong cluster key, or the datagram was altered)")]
    BadMac,
    #[error("bad field {0}")]
    BadField(&'static str),
    #[error("the body ends inside field {0}")]
    Truncated(&'static str),
    #[error("{0} trailing bytes after the body")]
    Trailing(usize),
    #[error("{what}: {got} is more than the limit of {limit}")]
    Limit { what: &'static str, got: usize, limit: usize },
}
