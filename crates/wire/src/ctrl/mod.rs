//! The control protocol: ACMS messages between `memlendd`s, one per UDP
//! datagram, each authenticated with the cluster key and numbered against
//! replay. Types in `msg`, the byte layout in `codec` and `body`, the MAC in
//! `auth`, the replay window in `replay`. The reference is `docs/control.md`.

mod auth;
mod body;
mod codec;
mod error;
mod msg;
mod replay;
#[cfg(test)]
mod tests;

pub use auth::{cluster_id_from_key, CtrlKey, CTRL_MAC_BYTES};
pub use codec::{decode, encode, CTRL_HEADER_BYTES, CTRL_MAGIC, DATAGRAM_BYTES_MIN};
pub use error::CtrlError;
pub use msg::*;
pub use replay::{ReplayError, ReplayGuard, REPLAY_WINDOW, SENDERS_MAX};
