//! The borrower's side of the page protocol.
//!
//! [`Conn`] is one authenticated connection with pipelined, tagged requests;
//! the caller's own thread sends and receives, so a request never hops cores.
//! [`RemoteStore`] is a `PageStore` over one slab on one donor: it splits
//! batches into protocol-sized requests, keeps many in flight, and reconnects
//! (re-attaching the same slab) when a connection breaks.

mod config;
mod conn;
mod error;
mod linger;
mod store;

pub use config::ClientConfig;
pub use conn::{Conn, Dest};
pub use error::ClientError;
pub use linger::linger_all;
pub use store::RemoteStore;
