use memlend_store::StoreError;
use memlend_wire::page::{FrameError, Status};
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("bad frame from donor: {0}")]
    Frame(#[from] FrameError),
    #[error("donor refused the connection: {0}")]
    Refused(Status),
    #[error("donor failed to prove the cluster key (wrong key, or not a memlend donor)")]
    ServerAuth,
    #[error("donor runs without a key (--insecure) and this client requires one")]
    InsecureDonor,
    #[error("donor answered {0}")]
    Status(Status),
    #[error("donor broke the protocol: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The connection is unusable, but a fresh one may succeed.
    pub fn is_transport(&self) -> bool {
        match self {
            ClientError::Io(_) | ClientError::Frame(_) | ClientError::Protocol(_) => true,
            ClientError::Status(s) => *s == Status::BadPayloadCrc,
            _ => false,
        }
    }

    pub fn into_store_error(self, what: &str) -> StoreError {
        match self {
            ClientError::Status(Status::OutOfRange) => {
                StoreError::Unavailable(format!("{what}: donor says out of range"))
            }
            ClientError::Status(Status::NoSpace) => {
                StoreError::NoSpace(format!("{what}: donor full"))
            }
            ClientError::Io(e) => StoreError::Io(e),
            e => StoreError::Unavailable(format!("{what}: {e}")),
        }
    }
}
