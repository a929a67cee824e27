use memlend_wire::nbd::DecodeError;
use std::io;
use thiserror::Error;

/// Why a connection ended other than by the client's own clean goodbye.
/// Each is logged with the peer; none affects any other connection.
#[derive(Debug, Error)]
pub enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("malformed message: {0}")]
    Decode(#[from] DecodeError),
    #[error("client sent more than {limit} options without choosing an export")]
    TooManyOptions { limit: u32 },
    #[error("OPT_EXPORT_NAME of {len_bytes} bytes exceeds {limit_bytes} and cannot be answered with an error")]
    ExportNameTooLong { len_bytes: u32, limit_bytes: u32 },
    #[error("export {0:?} does not exist (OPT_EXPORT_NAME cannot report errors)")]
    UnknownExport(String),
    #[error("client without fixed newstyle sent option {0}; only OPT_EXPORT_NAME is allowed")]
    NotFixedNewstyle(u32),
    #[error("WRITE of {len_bytes} bytes exceeds {limit_bytes}, too large to skip")]
    OversizeWrite { len_bytes: u32, limit_bytes: u64 },
    #[error("client asked for an export before STARTTLS, and this server requires TLS")]
    TlsRequired,
    #[error("server is shutting down")]
    ShuttingDown,
    #[error("client closed the connection during the handshake")]
    ClosedInHandshake,
    #[error("client stalled in the handshake for more than {timeout_ms} ms")]
    HandshakeTimeout { timeout_ms: u64 },
}

impl ConnError {
    /// Name the two ordinary ways a handshake read fails.
    pub(crate) fn in_handshake(self, timeout_ms: u64) -> ConnError {
        match self {
            ConnError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                ConnError::ClosedInHandshake
            }
            ConnError::Io(e)
                if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
            {
                ConnError::HandshakeTimeout { timeout_ms }
            }
            other => other,
        }
    }
}
