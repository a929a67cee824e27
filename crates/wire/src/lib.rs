//! Byte formats, and nothing else: no sockets, no threads, no clocks. Every
//! decoder takes a byte slice, checks every length and offset before use, and
//! returns a typed error on bad input. That is what makes them fuzzable.

pub mod ctrl;
pub mod nbd;
pub mod page;
mod wire_enum;
