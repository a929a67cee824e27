//! `memlend verify`: the end-to-end check the demo and the tests use. Every
//! page gets a pattern derived from its index and a run seed, so a page that
//! lands in the wrong place, or comes back stale, is caught.

use crate::donor::DonorArgs;
use anyhow::{bail, Result};
use clap::Args;
use memlend_node::size::{human, parse_pages};
use memlend_remote::RemoteStore;
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub donor: DonorArgs,
    /// How much to write and read back.
    #[arg(long, default_value = "256M", value_parser = parse_pages)]
    pub size: u64,
    /// Pages per store call.
    #[arg(long, default_value_t = 256)]
    pub batch_pages: u64,
}

/// Fill `buf` (whole pages starting at `page`) with the run's pattern.
pub fn pattern(seed: u64, page: u64, buf: &mut [u8]) {
    for (i, p) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
        let mut x = (seed ^ (page + i as u64)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for w in p.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
    }
}

pub fn run(a: &VerifyArgs) -> Result<()> {
    let store = RemoteStore::open(a.donor.donor, a.donor.client_config()?, a.size)?;
    let mut seed_bytes = [0u8; 8];
    getrandom::getrandom(&mut seed_bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    let seed = u64::from_le_bytes(seed_bytes);
    let batch = a.batch_pages.clamp(1, 4096);
    let mut buf = vec![0u8; batch as usize * PAGE_SIZE];
    let mut want = vec![0u8; buf.len()];

    let t = Instant::now();
    for page in (0..a.size).step_by(batch as usize) {
        let n = batch.min(a.size - page) as usize * PAGE_SIZE;
        pattern(seed, page, &mut buf[..n]);
        store.write(&[WriteOp { page, data: &buf[..n] }])?;
    }
    let write_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut bad_pages = 0u64;
    for page in (0..a.size).step_by(batch as usize) {
        let n = batch.min(a.size - page) as usize * PAGE_SIZE;
        store.read(&mut [ReadOp { page, buf: &mut buf[..n] }])?;
        pattern(seed, page, &mut want[..n]);
        for (i, (got, exp)) in
            buf[..n].chunks(PAGE_SIZE).zip(want[..n].chunks(PAGE_SIZE)).enumerate()
        {
            if got != exp {
                bad_pages += 1;
                tracing::error!(page = page + i as u64, "page read back differs");
            }
        }
    }
    let read_s = t.elapsed().as_secs_f64();
    let bytes = a.size * PAGE_SIZE as u64;
    let rate = |s: f64| format!("{}/s", human((bytes as f64 / s) as u64));
    println!(
        "verify: {} to slab {} on {}: wrote at {}, read back at {}, {} of {} pages differ",
        human(bytes),
        store.slab(),
        a.donor.donor,
        rate(write_s),
        rate(read_s),
        bad_pages,
        a.size
    );
    if bad_pages > 0 {
        bail!("{bad_pages} pages came back wrong");
    }
    Ok(())
}
