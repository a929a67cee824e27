//! `memlendd`: the memlend node daemon.
//!
//! It lends RAM over the page protocol (`--lend`) and, with `--nbd` or
//! `--nbd-unix` (`nbd_unix.rs`), as NBD exports carved out of the same
//! budget (`run.rs`). With `--cluster` it also
//! runs the ACMS control plane (`cluster/`): it classifies the node, offers,
//! grants and reclaims leases, and serves the local API socket for
//! `memlend run --pool` and `memlend status`. Settings come from the flags
//! (`args.rs`), or a TOML file they override (`config.rs`).

mod args;
mod cluster;
mod config;
mod nbd_unix;
mod run;

use clap::{CommandFactory, FromArgMatches};

fn main() {
    memlend_node::logging::init();
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("memlendd: {e:#}");
        std::process::exit(2);
    });
    if let Some(dir) = &args.generate_docs {
        if let Err(e) = memlend_node::cli_docs::write(args::Args::command(), dir) {
            eprintln!("memlendd: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(path) = &args.check_config {
        println!("memlendd: {} is a valid config", path.display());
        return;
    }
    if let Err(e) = run::run(args) {
        tracing::error!("{e:#}");
        eprintln!("memlendd: {e:#}");
        std::process::exit(1);
    }
}

/// The command line, with `--config FILE` (or `--check-config FILE`) read
/// in front of it: the file's settings first, so that flags override them.
fn parse_args() -> anyhow::Result<args::Args> {
    let cli: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cmd = args::Args::command();
    let matches = cmd.clone().try_get_matches_from(&cli).unwrap_or_else(|e| e.exit());
    let first = args::Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let Some(path) = first.config.as_ref().or(first.check_config.as_ref()) else {
        return Ok(first);
    };
    let mut all = vec![cli[0].clone()];
    all.extend(config::file_flags(path, &cmd, &matches)?);
    all.extend(cli[1..].iter().cloned());
    let matches = cmd.try_get_matches_from(&all).map_err(|e| {
        let text = e.render().to_string();
        anyhow::anyhow!("with config {}: {}", path.display(), text.trim_start_matches("error: "))
    })?;
    Ok(args::Args::from_arg_matches(&matches)?)
}
