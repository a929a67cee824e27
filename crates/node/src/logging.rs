//! Logging for the binaries: `tracing` to stderr, filtered by `MEMLEND_LOG`
//! (same syntax as `RUST_LOG`), `info` by default. Colour only on a terminal,
//! so log files and test captures stay plain text.

use std::io::IsTerminal;

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MEMLEND_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}
