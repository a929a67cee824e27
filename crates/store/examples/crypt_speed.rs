//! What the `crypt` layer costs: throughput of `Crypt<RamStore>` against a
//! bare `RamStore` for single-page and 64-page reads and writes, one thread.
//!
//! Run: `cargo run -p memlend-store --release --example crypt_speed`.
//! Prints MB/s (10^6 bytes a second) of page bytes and the ratio crypt/ram.
//! Every page is written once before measuring, so no time goes to first
//! faults; the best of `ROUNDS` rounds is kept, since the machine is shared.

use memlend_store::layer::{Crypt, LocalTags};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use std::time::{Duration, Instant};

/// Pages in the working set: 64 MiB, beyond the caches, as a lease is.
const PAGES: u64 = 16384;
/// Pages per batch in the batched runs.
const BATCH_PAGES: u64 = 64;
const ROUNDS: usize = 5;

fn main() {
    let ram = RamStore::new(PAGES, RamOptions::default()).unwrap();
    let below = LocalTags::new(RamStore::new(PAGES, RamOptions::default()).unwrap()).unwrap();
    let crypt = Crypt::new(below, [7; 32]).unwrap();
    println!("{PAGES} pages ({} MiB), one thread, best of {ROUNDS} rounds", PAGES >> 8);
    println!("{:26} {:>10} {:>10} {:>11}", "", "ram MB/s", "crypt MB/s", "crypt/ram");
    for batch_pages in [1, BATCH_PAGES] {
        let write = |s: &dyn PageStore| best(|| write_all(s, batch_pages));
        let read = |s: &dyn PageStore| best(|| read_all(s, batch_pages));
        report(&format!("write, {batch_pages} page(s) a batch"), write(&ram), write(&crypt));
        report(&format!("read, {batch_pages} page(s) a batch"), read(&ram), read(&crypt));
    }
    assert_eq!(crypt.corrupt_pages(), 0);
}

fn best(mut run: impl FnMut()) -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            run();
            started.elapsed()
        })
        .min()
        .unwrap()
}

fn write_all(s: &dyn PageStore, batch_pages: u64) {
    let data: Vec<u8> = (0..batch_pages as usize * PAGE_SIZE).map(|i| i as u8).collect();
    for page in (0..PAGES).step_by(batch_pages as usize) {
        s.write(&[WriteOp { page, data: &data }]).unwrap();
    }
}

fn read_all(s: &dyn PageStore, batch_pages: u64) {
    let mut buf = vec![0u8; batch_pages as usize * PAGE_SIZE];
    for page in (0..PAGES).step_by(batch_pages as usize) {
        s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
        std::hint::black_box(&buf);
    }
}

fn report(what: &str, ram: Duration, crypt: Duration) {
    let mbps = |t: Duration| (PAGES as usize * PAGE_SIZE) as f64 / t.as_secs_f64() / 1e6;
    let (ram, crypt) = (mbps(ram), mbps(crypt));
    println!("{what:26} {ram:10.0} {crypt:10.0} {:10.3}x", crypt / ram);
}
