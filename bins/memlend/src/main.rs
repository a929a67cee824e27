//! `memlend`: the command line. Talks to donors and to the local daemon.

mod balloon;
mod bench;
mod donor;
mod far;
mod lab;
mod replay;
mod run;
mod sim;
mod status;
mod top;
mod verify;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(version, about = "memlend: use more memory than this machine has")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write a fresh cluster key file (mode 0600).
    Keygen { file: PathBuf },
    /// Show the cluster as the local memlendd sees it (or one donor's
    /// budget, with --donor).
    Status(status::StatusArgs),
    /// A live view of this node and the processes that borrow through it
    /// (q quits).
    Top(top::TopArgs),
    /// Write a pattern to a donor, read it back and compare every byte.
    Verify(verify::VerifyArgs),
    /// Measure the page protocol: pages/s and latency, pipelined.
    Bench(bench::BenchArgs),
    /// Far memory: a region larger than its local budget, pages on a donor
    /// (or --ssd), written, touched at random and read back byte for byte.
    Far(far::FarArgs),
    /// Run a program with its large allocations in far memory: on donors
    /// (--donor) or a local SSD file. Prints what far memory did at the end.
    Run(Box<run::RunArgs>),
    /// Replay page-access traces (`run --trace`) through eviction
    /// policies; print misses against Belady's optimum.
    Replay(replay::ReplayArgs),
    /// Simulate the control plane of N nodes (real engine, seeded network)
    /// and print what it costs and achieves (docs/scale.md).
    Sim(sim::SimArgs),
    /// A cluster on one machine: namespaces, a bridge, cgroups, daemons.
    Lab(lab::LabArgs),
    /// Hold memory in a detached process (in a lab node with --node).
    Balloon(balloon::BalloonArgs),
    #[command(hide = true)]
    BalloonHold(balloon::HoldArgs),
    #[command(hide = true)]
    NetemHold(lab::delayer::HoldArgs),
    /// Write man pages and shell completions into DIR (for packaging).
    #[command(hide = true)]
    GenerateDocs { dir: PathBuf },
}

fn main() {
    memlend_node::logging::init();
    let cli = Cli::parse();
    let result: Result<()> = match cli.cmd {
        Cmd::Keygen { file } => memlend_node::keyfile::generate(&file).map(|_| {
            println!("wrote a new cluster key to {} (mode 0600)", file.display());
        }),
        Cmd::Status(a) => status::run(&a),
        Cmd::Top(a) => top::run(&a),
        Cmd::Verify(a) => verify::run(&a),
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Far(a) => far::run(&a),
        Cmd::Run(a) => run::run(&a),
        Cmd::Lab(a) => lab::run(&a),
        Cmd::Replay(a) => replay::run(&a),
        Cmd::Sim(a) => sim::run(&a),
        Cmd::Balloon(a) => balloon::run(&a),
        Cmd::BalloonHold(a) => balloon::hold(&a),
        Cmd::NetemHold(a) => lab::delayer::hold(&a),
        Cmd::GenerateDocs { dir } => {
            use clap::CommandFactory;
            memlend_node::cli_docs::write(Cli::command(), &dir).map(|_| ())
        }
    };
    if let Err(e) = result {
        eprintln!("memlend: {e:#}");
        std::process::exit(1);
    }
}
