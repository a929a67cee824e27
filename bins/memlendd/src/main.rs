//! `memlendd`: the memlend node daemon.
//!
//! Today it lends a fixed amount of RAM (`--lend`) over the page protocol and,
//! with `--nbd`, as NBD exports carved out of the same budget. The ACMS
//! control plane (classification, offers, grants, reclaim) joins this binary
//! later as another service beside these two.

mod args;
mod cluster;
mod run;

use clap::Parser;

fn main() {
    memlend_node::logging::init();
    let args = args::Args::parse();
    if let Err(e) = run::run(args) {
        tracing::error!("{e:#}");
        eprintln!("memlendd: {e:#}");
        std::process::exit(1);
    }
}
