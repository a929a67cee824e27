//! `memlend bench`: pages/s and latency of the page protocol with N
//! connections and D requests in flight on each. Each connection runs on its
//! own thread with its own slab, prefilled so that reads move real data.

use crate::donor::DonorArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use memlend_node::size::parse_pages;
use memlend_remote::{Conn, Dest};
use memlend_wire::page::{Opcode, ReqHeader, Status, REP_HEADER_LEN};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum BenchOp {
    Read,
    Write,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub donor: DonorArgs,
    #[arg(long, value_enum, default_value = "read")]
    pub op: BenchOp,
    /// Connections, one thread each.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub depth: u32,
    /// Pages per request.
    #[arg(long, default_value_t = 1)]
    pub pages_per_req: u32,
    /// Slab size per connection.
    #[arg(long, default_value = "256M", value_parser = parse_pages)]
    pub slab: u64,
    #[arg(long, default_value_t = 5.0)]
    pub secs: f64,
    /// Print one JSON object instead of a line for people.
    #[arg(long)]
    pub json: bool,
}

struct ThreadResult {
    requests: u64,
    hist: Histogram<u64>,
}

pub fn run(a: &BenchArgs) -> Result<()> {
    if a.depth == 0 || a.depth > 128 || a.conns == 0 || a.conns > 64 {
        bail!("--depth must be 1..=128 and --conns 1..=64");
    }
    let cfg = a.donor.client_config()?;
    let mut conns = Vec::new();
    for _ in 0..a.conns {
        let mut c = a.donor.connect(&cfg)?;
        let h = ReqHeader { page: a.slab, ..ReqHeader::new(Opcode::OpenSlab, 0) };
        let slab = c.call(h, &[], None).context("open slab")?.value as u32;
        prefill(&mut c, slab, a.slab)?;
        conns.push((c, slab));
    }
    let duration = Duration::from_secs_f64(a.secs);
    let start = Instant::now();
    let results: Vec<Result<ThreadResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(i, (c, slab))| s.spawn(move || drive(c, *slab, a, duration, i as u64)))
            .collect();
        handles.into_iter().map(|h| h.join().expect("bench thread panicked")).collect()
    });
    let elapsed_s = start.elapsed().as_secs_f64();
    for (c, slab) in &mut conns {
        let h = ReqHeader { slab: *slab, ..ReqHeader::new(Opcode::CloseSlab, 0) };
        c.call(h, &[], None).context("close slab")?;
    }
    let mut hist = Histogram::<u64>::new(3)?;
    let mut requests = 0;
    for r in results {
        let r = r?;
        requests += r.requests;
        hist.add(&r.hist)?;
    }
    report(a, requests, elapsed_s, &hist);
    Ok(())
}

fn report(a: &BenchArgs, requests: u64, elapsed_s: f64, hist: &Histogram<u64>) {
    let pages_per_s = (requests * a.pages_per_req as u64) as f64 / elapsed_s;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    if a.json {
        let v = serde_json::json!({
            "op": format!("{:?}", a.op).to_lowercase(), "conns": a.conns, "depth": a.depth,
            "pages_per_req": a.pages_per_req, "requests": requests, "elapsed_s": elapsed_s,
            "pages_per_s": pages_per_s, "gbit_per_s": pages_per_s * 4096.0 * 8.0 / 1e9,
            "latency_us_p50": us(0.5), "latency_us_p99": us(0.99), "latency_us_p999": us(0.999),
        });
        println!("{v}");
    } else {
        println!(
            "{:?} conns={} depth={} pages/req={}: {:.0} pages/s, p50 {:.1} µs, p99 {:.1} µs",
            a.op,
            a.conns,
            a.depth,
            a.pages_per_req,
            pages_per_s,
            us(0.5),
            us(0.99)
        );
    }
}

/// Write every page once so reads return real data, not the zero page.
fn prefill(c: &mut Conn, slab: u32, pages: u64) -> Result<()> {
    let batch = c.batch_pages_max as u64;
    let data = vec![0xa5u8; batch as usize * 4096];
    for page in (0..pages).step_by(batch as usize) {
        let n = batch.min(pages - page);
        let h = ReqHeader { slab, page, count: n as u32, ..ReqHeader::new(Opcode::Write, 0) };
        c.call(h, &[&data[..n as usize * 4096]], None).context("prefill")?;
    }
    Ok(())
}

/// Keep `depth` requests in flight until `duration` passes. Replies that
/// arrived together are answered with one batch of new requests.
fn drive(
    c: &mut Conn,
    slab: u32,
    a: &BenchArgs,
    duration: Duration,
    seed: u64,
) -> Result<ThreadResult> {
    let mut hist = Histogram::<u64>::new(3)?;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let span = a.slab / a.pages_per_req as u64;
    let payload = vec![0x5au8; a.pages_per_req as usize * 4096];
    let mut sent_at = vec![Instant::now(); 256];
    let mut issue = |c: &mut Conn, sent_at: &mut [Instant]| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let page = (rng % span) * a.pages_per_req as u64;
        let op = if a.op == BenchOp::Read { Opcode::Read } else { Opcode::Write };
        let h = ReqHeader { slab, page, count: a.pages_per_req, ..ReqHeader::new(op, 0) };
        let body: &[&[u8]] = if a.op == BenchOp::Write { &[&payload] } else { &[] };
        let tag = c.queue(h, body);
        sent_at[tag as usize % 256] = Instant::now();
    };
    for _ in 0..a.depth {
        issue(c, &mut sent_at);
    }
    c.send()?;
    let (start, mut requests, mut owed) = (Instant::now(), 0u64, 0u32);
    let mut sink = vec![0u8; payload.len()];
    loop {
        let r =
            c.recv(|_| Some(&mut sink[..]).filter(|_| a.op == BenchOp::Read).map(Dest::from))?;
        if r.status != Status::Ok {
            bail!("donor answered {}", r.status);
        }
        hist.record(sent_at[r.tag as usize % 256].elapsed().as_nanos() as u64)?;
        requests += 1;
        owed += 1;
        if c.buffered_bytes() >= REP_HEADER_LEN {
            continue;
        }
        if start.elapsed() >= duration {
            break;
        }
        for _ in 0..owed {
            issue(c, &mut sent_at);
        }
        owed = 0;
        c.send()?;
    }
    for _ in 0..(a.depth - owed) {
        c.recv(|_| Some(&mut sink[..]).filter(|_| a.op == BenchOp::Read).map(Dest::from))?;
    }
    Ok(ThreadResult { requests, hist })
}
