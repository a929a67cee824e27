use crate::page::Status;
use thiserror::Error;

/// A frame that cannot be decoded. Each maps to the `Status` the server
/// answers with before closing (or, for payload errors, continuing).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad magic {0:#010x}")]
    BadMagic(u64),
    #[error("header CRC mismatch: carried {carried:#010x}, computed {computed:#010x}")]
    BadHeaderCrc { carried: u32, computed: u32 },
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    #[error("reserved field is {0:#x}, must be zero")]
    BadFlags(u32),
    #[error("{what}: {got} is more than the limit of {limit}")]
    TooLarge { what: &'static str, got: u64, limit: u64 },
    #[error("batch of {got} pages: must be 1 to {limit}")]
    BadBatch { got: u64, limit: u64 },
    #[error("{what}: payload of {got} bytes, expected {expected}")]
    BadLength { what: &'static str, got: u64, expected: u64 },
    #[error("frame truncated: {got} of {need} bytes")]
    Truncated { got: usize, need: usize },
}

impl FrameError {
    pub fn status(&self) -> Status {
        match self {
            FrameError::BadMagic(_) | FrameError::Truncated { .. } => Status::BadMagic,
            FrameError::BadHeaderCrc { .. } => Status::BadHeaderCrc,
            FrameError::UnknownOpcode(_) => Status::UnknownOpcode,
            FrameError::BadFlags(_) => Status::BadFlags,
            FrameError::TooLarge { .. } => Status::BadLength,
            FrameError::BadBatch { .. } => Status::BatchTooLarge,
            FrameError::BadLength { .. } => Status::BadLength,
        }
    }
}
