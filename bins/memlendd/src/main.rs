//! The memlend node daemon
fn main() {}
