//! `memlend far`: a far-memory region larger than its local budget, its pages
//! on a donor (or on a local SSD file), driven by a workload that checks
//! every byte. The first user of `memlend-fault`; `memlend run` comes next.

use crate::donor::DonorArgs;
use crate::verify::pattern;
use anyhow::{bail, Context, Result};
use clap::Args;
use memlend_borrow::{Placement, Redundancy};
use memlend_fault::{Region, RegionConfig, Tuning};
use memlend_node::size::{human, parse_pages};
use memlend_store::layer::Stack;
use memlend_store::PAGE_SIZE;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct FarArgs {
    #[command(flatten)]
    pub donor: DonorArgs,
    /// Keep pages in a local file (SSD as memory) instead of on the donor: a
    /// new path or a directory (the file is unlinked at once, so nothing is
    /// left behind), or a block device.
    #[arg(long)]
    pub ssd: Option<PathBuf>,
    /// Size of the region.
    #[arg(long, default_value = "1G", value_parser = parse_pages)]
    pub size: u64,
    /// Local budget: most pages resident at once.
    #[arg(long, default_value = "256M", value_parser = parse_pages)]
    pub local: u64,
    /// More donors: pages are striped over --donor and these, in chunks of
    /// 64 pages (256 KiB).
    #[arg(long = "also", value_name = "ADDR")]
    pub more_donors: Vec<std::net::SocketAddr>,
    /// Random page touches in the second pass, as a multiple of the pages.
    #[arg(long, default_value_t = 1)]
    pub random_passes: u64,
    /// Threads that share the random touches, each on its own stream of
    /// pages: many faulters at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub threads: u64,
    /// Faults of several threads that arrive together share a store read
    /// (as `memlend run --batch-faults`).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub batch_faults: String,
    /// Keep touching random pages (checking each) for this many seconds
    /// after the passes: long enough for a donor to reclaim mid-run.
    #[arg(long, default_value_t = 0)]
    pub hold_s: u64,
    /// Borrow the pages from the cluster through the local memlendd (its API
    /// socket; default $MEMLEND_POOL or /run/memlend/memlendd.sock). With
    /// --ssd, that is where reclaimed pages go when no donor has room.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1)]
    pub pool: Option<Option<PathBuf>>,
    /// A second home for every page: `mirror` (two donors hold each page;
    /// needs --also), `ssd` (a donor and a file in the --ssd directory),
    /// `erasure` (Reed-Solomon over three or more donors: 1 parity donor, 2
    /// from five), or `none`. A mirror's lost copy is rebuilt on another
    /// donor in the background.
    #[arg(long, default_value = "none")]
    pub redundancy: Redundancy,
    /// Send pages to donors in plain text. By default each page is
    /// encrypted (AES-256-GCM) with a key that never leaves this process.
    #[arg(long)]
    pub no_encrypt: bool,
    /// Named layers over the store, outermost first, e.g. `checksum,stats`
    /// (known: checksum, crypt, pack, pack-zstd, stats); each one's report is printed at the end.
    #[arg(long, value_name = "SPEC")]
    pub layers: Option<Stack>,
}

fn placement(a: &FarArgs) -> Placement {
    Placement { layers: a.layers.clone().unwrap_or_default(), ..where_to(a) }
}

/// Where the pages go, from the flags.
fn where_to(a: &FarArgs) -> Placement {
    if let Some(api) = &a.pool {
        let api = api.clone().unwrap_or_else(memlend_borrow::open::cluster::default_api_path);
        return Placement {
            pool: Some(api),
            ssd: a.ssd.clone(),
            key: a.donor.key.clone(),
            insecure: a.donor.insecure,
            no_encrypt: a.no_encrypt,
            redundancy: a.redundancy,
            ..Placement::default()
        };
    }
    match &a.ssd {
        Some(path) if a.redundancy == Redundancy::None => {
            Placement { ssd: Some(path.clone()), ..Placement::default() }
        }
        _ => Placement {
            donors: std::iter::once(a.donor.donor).chain(a.more_donors.iter().copied()).collect(),
            ssd: a.ssd.clone(),
            key: a.donor.key.clone(),
            insecure: a.donor.insecure,
            redundancy: a.redundancy,
            no_encrypt: a.no_encrypt,
            ..Placement::default()
        },
    }
}

pub fn run(a: &FarArgs) -> Result<()> {
    if a.local >= a.size {
        bail!("--local must be smaller than --size for far memory to matter");
    }
    let opened = placement(a).open(Some(a.size))?;
    let (store, where_) = (Arc::clone(&opened.store), opened.describe.clone());
    let cfg = RegionConfig {
        size_bytes: a.size as usize * PAGE_SIZE,
        budget_pages: a.local as usize,
        ..RegionConfig::default()
    };
    let tuning = Tuning { batch_fault_reads: a.batch_faults == "on", ..Tuning::default() };
    let region =
        Region::with_tuning(cfg, tuning, Arc::clone(&store)).context("far-memory region")?;
    // SAFETY: the region maps `len()` bytes for as long as `region` lives,
    // and only this function and the threads it scopes touch it, through
    // its borrows; userfaultfd supplies every page.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) };
    let seed = 0x6d656d6c656e64;
    let t = Instant::now();
    for (page, chunk) in mem.chunks_exact_mut(PAGE_SIZE).enumerate() {
        pattern(seed, page as u64, chunk);
    }
    let write_s = t.elapsed().as_secs_f64();
    let (random_s, mut random_bad) = random_pass(mem, seed, a.size * a.random_passes, a.threads);
    let (held_bad, longest_touch_ms) = hold(mem, seed, a.hold_s);
    random_bad += held_bad;
    let t = Instant::now();
    let mut want = vec![0u8; PAGE_SIZE];
    let mut bad = random_bad;
    for (page, chunk) in mem.chunks_exact(PAGE_SIZE).enumerate() {
        pattern(seed, page as u64, &mut want);
        bad += u64::from(chunk != &want[..]);
    }
    let verify_s = t.elapsed().as_secs_f64();
    let st = region.stats();
    let rate = |pages: u64, s: f64| format!("{:.0} pages/s", pages as f64 / s);
    println!(
        "far: {} region, {} local, pages on {where_}",
        human(a.size * PAGE_SIZE as u64),
        human(a.local * PAGE_SIZE as u64)
    );
    println!("  write every page         {}", rate(a.size, write_s));
    println!(
        "  random touches (verify) {} ({} thread(s))",
        rate(a.size * a.random_passes, random_s),
        a.threads
    );
    println!("  read every page (verify) {}", rate(a.size, verify_s));
    println!(
        "  faults: {} zero-filled, {} from the store; {} pages written back in {} batches; {} resident (budget {})",
        st.faults_zero_filled,
        st.faults_from_store,
        st.pages_written_back,
        st.eviction_batches,
        st.pages_resident,
        a.local
    );
    let h = region.handler_stats();
    println!("  fault handler moved core {} times", h.handler_moves);
    if let Some((read_us, map_us)) = h.fault_parts_us(region.stats().faults_from_store) {
        println!("  a fault from the store: {read_us:.1} us in its read, {map_us:.1} us mapping it (means)");
        let us = |ns: u64| ns as f64 / 1000.0;
        println!(
            "  store-fault latency (message read to wake): p50 {:.1} / p99 {:.1} / p99.9 {:.1} us",
            us(h.fault_store_latency_ns_p50),
            us(h.fault_store_latency_ns_p99),
            us(h.fault_store_latency_ns_p999)
        );
    }
    if a.hold_s > 0 {
        println!("  longest touch while held: {longest_touch_ms} ms");
    }
    for report in &opened.reports {
        println!("  {}", report());
    }
    let m = opened.mirror_stats();
    if m.legs > 0 {
        println!(
            "  copies: {} of {} legs healthy; {} legs failed, {} rebuilt ({} pages); {} bad copies, {} repaired; {} pages lost",
            m.healthy_legs, m.legs, m.leg_failures, m.rebuilds, m.pages_rebuilt, m.bad_copies, m.repaired_pages, m.lost_pages
        );
    }
    if st.pages_resident > a.local {
        println!(
            "  over budget: {} pages resident: the store refused write-backs (see the log)",
            st.pages_resident
        );
    }
    println!("  {bad} of {} pages differ", a.size);
    if bad > 0 || st.pages_resident > a.local || m.lost_pages > 0 {
        bail!("far memory check failed");
    }
    Ok(())
}

/// Random checked touches for `hold_s` seconds, a line of progress each.
/// Every other page touched is also written (the same bytes again), so the
/// region keeps dirtying pages and writing them back while leases move or
/// donors fail. Returns the pages that differed and the longest touch in
/// ms: the pause the program saw.
fn hold(mem: &mut [u8], seed: u64, hold_s: u64) -> (u64, u64) {
    let start = Instant::now();
    let pages = (mem.len() / PAGE_SIZE) as u64;
    let mut want = vec![0u8; PAGE_SIZE];
    let (mut x, mut bad, mut longest_ms) = (seed | 1, 0, 0);
    let mut last = Instant::now();
    for second in 1..=hold_s {
        let mut touches = 0u64;
        while start.elapsed().as_secs() < second {
            longest_ms = longest_ms.max(last.elapsed().as_millis() as u64);
            last = Instant::now();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let page = x % pages;
            let at = page as usize * PAGE_SIZE;
            pattern(seed, page, &mut want);
            bad += u64::from(mem[at..at + PAGE_SIZE] != want[..]);
            if touches.is_multiple_of(2) {
                mem[at..at + PAGE_SIZE].copy_from_slice(&want);
            }
            touches += 1;
        }
        println!("  held {second} s: {touches} pages checked, {bad} differ so far");
    }
    (bad, longest_ms)
}

/// Touch `touches` random pages, shared by `threads` threads, each on its
/// own random stream, and check each page against its pattern.
fn random_pass(mem: &[u8], seed: u64, touches: u64, threads: u64) -> (f64, u64) {
    let t = Instant::now();
    let bad = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let share = touches / threads + u64::from(i < touches % threads);
                let stream = (seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
                s.spawn(move || random_touches(mem, seed, stream, share))
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a touch thread panicked")).sum()
    });
    (t.elapsed().as_secs_f64(), bad)
}

/// `touches` random pages from the xorshift stream `x`; the pages that differ.
fn random_touches(mem: &[u8], seed: u64, mut x: u64, touches: u64) -> u64 {
    let pages = (mem.len() / PAGE_SIZE) as u64;
    let mut want = vec![0u8; PAGE_SIZE];
    let mut bad = 0;
    for _ in 0..touches {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let page = x % pages;
        let at = page as usize * PAGE_SIZE;
        pattern(seed, page, &mut want);
        bad += u64::from(mem[at..at + PAGE_SIZE] != want[..]);
    }
    bad
}
