//! The control protocol: ACMS messages between `memlendd`s, one per UDP
//! datagram, each authenticated with the cluster key and numbered against
//! replay. Types here; the byte layout, the MAC and the replay window are in
//! the submodules. The reference is `docs/control.md`.

mod msg;

pub use msg::*;
