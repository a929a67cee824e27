//! The packet holder behind `lab netem`, run inside a node as the hidden
//! `memlend netem-hold`. It is bound to an NFQUEUE that the node's INPUT
//! chain feeds: each packet is dropped with the loss probability, or held
//! for the delay and then accepted, in arrival order. This kernel has no
//! sch_netem; NFQUEUE is built in, and `--queue-bypass` on the rule lets
//! packets through untouched whenever no holder is bound.

use anyhow::{Context, Result};
use clap::Args;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Most packets held at once: the kernel queue's length too, so the kernel
/// drops (like a full netem queue) rather than this process growing.
pub const HELD_MAX: usize = 16 * 1024;
/// Longest sleep between looks at the queue: an arrival waits at most this
/// long to be stamped, so a delay is exact to about a millisecond.
const TICK: Duration = Duration::from_millis(1);
/// Most packets taken off the queue per tick, so verdicts are never starved.
const RECV_PER_TICK_MAX: usize = 4096;
/// Upper limits on what `lab netem` accepts.
pub const DELAY_MS_MAX: u64 = 10_000;
pub const PPM: u32 = 1_000_000;

#[derive(Args, Debug)]
pub struct HoldArgs {
    #[arg(long)]
    pub queue: u16,
    #[arg(long)]
    pub delay_ms: u64,
    /// Loss in parts per million.
    #[arg(long)]
    pub loss_ppm: u32,
    /// Written once bound to the queue: the caller waits for it.
    #[arg(long)]
    pub ready: PathBuf,
}

#[derive(Default)]
struct Counts {
    held: u64,
    dropped: u64,
}

pub fn hold(a: &HoldArgs) -> Result<()> {
    assert!(a.delay_ms <= DELAY_MS_MAX && a.loss_ppm <= PPM, "lab netem checks its limits");
    let delay = Duration::from_millis(a.delay_ms);
    let mut q = open(a.queue)?;
    std::fs::write(&a.ready, b"").with_context(|| format!("cannot write {}", a.ready.display()))?;
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::with_capacity(HELD_MAX);
    let mut rng = Rng::seeded();
    let mut counts = Counts::default();
    let mut last_report = Instant::now();
    loop {
        take_arrivals(&mut q, &mut held, &mut rng, a.loss_ppm, delay, &mut counts)?;
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, mut msg) = held.pop_front().expect("checked non-empty");
            msg.set_verdict(nfq::Verdict::Accept);
            q.verdict(msg).context("NFQUEUE verdict")?;
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            println!("netem: {} packets delayed, {} dropped", counts.held, counts.dropped);
            last_report = Instant::now();
        }
        let next = held.front().map_or(TICK, |(due, _)| due.saturating_duration_since(now));
        std::thread::sleep(next.min(TICK));
    }
}

fn open(queue: u16) -> Result<nfq::Queue> {
    let mut q = nfq::Queue::open().context("cannot open an NFQUEUE netlink socket")?;
    q.bind(queue).with_context(|| format!("cannot bind NFQUEUE {queue}"))?;
    q.set_copy_range(queue, 0)?; // metadata only: the payload is never looked at
    q.set_queue_max_len(queue, HELD_MAX as u32)?;
    q.set_recv_gso(queue, true)?; // big offloaded packets stay whole
    q.set_nonblocking(true);
    Ok(q)
}

fn take_arrivals(
    q: &mut nfq::Queue,
    held: &mut VecDeque<(Instant, nfq::Message)>,
    rng: &mut Rng,
    loss_ppm: u32,
    delay: Duration,
    counts: &mut Counts,
) -> Result<()> {
    for _ in 0..RECV_PER_TICK_MAX {
        let mut msg = match q.recv() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            // The socket overflowed: those packets wait in the kernel queue
            // until it is unbound. Say so and go on.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                eprintln!("netem: netlink overflow, some packets are stuck");
                return Ok(());
            }
            Err(e) => return Err(e).context("NFQUEUE receive"),
        };
        if rng.below(PPM) < loss_ppm {
            msg.set_verdict(nfq::Verdict::Drop);
            q.verdict(msg).context("NFQUEUE verdict")?;
            counts.dropped += 1;
            continue;
        }
        // The kernel queue holds at most HELD_MAX unverdicted packets.
        assert!(held.len() < HELD_MAX, "more packets held than the kernel queue allows");
        held.push_back((Instant::now() + delay, msg));
        counts.held += 1;
    }
    Ok(())
}

/// xorshift64*: loss needs no more than an even spread.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).expect("getrandom");
        Rng(u64::from_le_bytes(b) | 1)
    }

    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % u64::from(n)) as u32
    }
}
