//! The donor's servers: the page server (memlend's own protocol) and the NBD
//! export. Both are blocking thread-per-connection servers: on a 2-core
//! machine pipelining and batching matter far more than an async runtime, and
//! a request served on the thread that read it never crosses cores.

pub mod lifecycle;
mod out_buf;

pub mod nbd;
pub mod page;
