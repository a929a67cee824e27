use std::io;
use thiserror::Error;

pub type Result<T> = std::result::Result<T, FaultError>;

/// Why a region could not be set up.
#[derive(Debug, Error)]
pub enum FaultError {
    #[error("invalid region config: {0}")]
    Config(String),
    #[error("invalid range: {0}")]
    Range(String),
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl FaultError {
    pub(crate) fn os(what: &'static str) -> impl FnOnce(io::Error) -> FaultError {
        move |source| FaultError::Os { what, source }
    }
}
