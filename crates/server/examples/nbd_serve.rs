//! A standalone NBD server over a RAM store, for manual testing and the
//! benchmark until `memlendd --nbd` exists.
//!
//! ```text
//! nbd_serve [--listen 127.0.0.1:10809] [--size 1G] [--name memlend] [--read-only] [--prealloc]
//!           [--spin-us N]
//! ```
//! Prints `listening on ADDR` once ready (useful with port 0). Logs go to
//! stderr; set `RUST_LOG=debug` for more.

use memlend_server::lifecycle::Shutdown;
use memlend_server::nbd::{serve, Export, NbdConfig};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;

struct Args {
    listen: String,
    size_bytes: u64,
    name: String,
    read_only: bool,
    prealloc: bool,
    cfg: NbdConfig,
}

fn parse_size(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        b'T' | b't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        listen: "127.0.0.1:10809".into(),
        size_bytes: 1 << 30,
        name: "memlend".into(),
        read_only: false,
        prealloc: false,
        cfg: NbdConfig::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?,
            "--size" => a.size_bytes = parse_size(&value()?).ok_or("bad --size")?,
            "--name" => a.name = value()?,
            "--read-only" => a.read_only = true,
            "--prealloc" => a.prealloc = true,
            "--spin-us" => {
                a.cfg.spin_before_sleep_us = value()?.parse().map_err(|_| "bad --spin-us")?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.size_bytes == 0 || !a.size_bytes.is_multiple_of(PAGE_SIZE as u64) {
        return Err("--size must be a non-zero multiple of 4096".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nbd_serve: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nbd_serve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let opts = RamOptions { prealloc: a.prealloc, mlock: false };
    let store = Arc::new(RamStore::new(a.size_bytes / PAGE_SIZE as u64, opts)?);
    let export =
        Export::new(a.name, store).description("memlend RAM export").read_only(a.read_only);
    let listener = TcpListener::bind(&a.listen)?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    // SIGINT/SIGTERM end the process; a RAM export has nothing to save.
    serve(listener, vec![export], a.cfg, Shutdown::new())?;
    Ok(())
}
