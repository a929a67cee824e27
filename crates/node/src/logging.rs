//! Logging for the binaries: `tracing` to stderr, filtered by `MEMLEND_LOG`
//! (same syntax as `RUST_LOG`), `info` by default.

pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MEMLEND_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
