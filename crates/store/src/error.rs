use thiserror::Error;

pub type StoreResult<T> = Result<T, StoreError>;

/// Why a store operation failed. Front-ends map each variant to their own
/// numbered error (page protocol) or errno (NBD); see `StoreError::errno`.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("pages {page}..+{count} are outside the store of {pages} pages")]
    OutOfRange { page: u64, count: u64, pages: u64 },
    #[error("buffer of {len_bytes} bytes is not a non-zero multiple of 4096")]
    Misaligned { len_bytes: usize },
    #[error("page {page} failed its check (a checksum, or a compressed page that does not decode): expected {expected:#010x}, found {actual:#010x}")]
    Corrupt { page: u64, expected: u32, actual: u32 },
    #[error("no space: {0}")]
    NoSpace(String),
    #[error("store is unavailable: {0}")]
    Unavailable(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl StoreError {
    /// The errno that best describes this error, for protocols that speak errno.
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::OutOfRange { .. } | StoreError::Misaligned { .. } => libc::EINVAL,
            StoreError::Corrupt { .. } => libc::EIO,
            StoreError::NoSpace(_) => libc::ENOSPC,
            StoreError::Unavailable(_) => libc::EIO,
            StoreError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}
