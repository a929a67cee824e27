//! The memlend command line
fn main() {}
