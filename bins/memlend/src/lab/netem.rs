//! `memlend lab netem NODE... --delay-ms D --loss-pct P` (or `--clear`):
//! what `tc qdisc ... netem delay D loss P` does, on a kernel without
//! sch_netem. Every packet arriving at a named node (loopback aside) goes
//! through an NFQUEUE to a holder process inside that node (delayer.rs).
//! A packet is delayed once, by its receiver, so the round trip between two
//! shaped nodes grows by 2 D, as with netem on each node's link.

use super::delayer::{DELAY_MS_MAX, PPM};
use super::{names, procs};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The queue number inside each node (queues are per network namespace).
const QUEUE: &str = "1717";
/// Marker in the holder's command line, so a pid file can be trusted.
pub const HOLDER: &str = "netem-hold";
/// How long a holder gets to bind its queue.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Most copies of our rule `--clear` removes from one chain.
const RULES_MAX: usize = 16;

#[derive(Args, Debug)]
pub struct NetemArgs {
    /// The nodes whose arriving packets are shaped, e.g. ml-n1 ml-n2.
    #[arg(required = true)]
    nodes: Vec<String>,
    /// Hold each arriving packet this long (at most 10000).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Drop this share of arriving packets (0 to 100).
    #[arg(long, default_value_t = 0.0)]
    loss_pct: f64,
    /// Stop shaping the nodes.
    #[arg(long, conflicts_with_all = ["delay_ms", "loss_pct"])]
    clear: bool,
}

pub fn run(a: &NetemArgs) -> Result<()> {
    if a.delay_ms > DELAY_MS_MAX {
        bail!("--delay-ms {} is more than the {DELAY_MS_MAX} allowed", a.delay_ms);
    }
    if !(0.0..=100.0).contains(&a.loss_pct) {
        bail!("--loss-pct {} is not between 0 and 100", a.loss_pct);
    }
    let loss_ppm = (a.loss_pct / 100.0 * f64::from(PPM)).round() as u32;
    for node in &a.nodes {
        names::prefix_of(node)?;
        clear(node)?;
        if a.clear || (a.delay_ms == 0 && loss_ppm == 0) {
            println!("{node}: packets pass untouched");
            continue;
        }
        start(node, a.delay_ms, loss_ppm)?;
        println!("{node}: arriving packets delayed {} ms, {}% dropped", a.delay_ms, a.loss_pct);
    }
    Ok(())
}

fn files(node: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = names::state_dir(&names::prefix_of(node)?);
    anyhow::ensure!(dir.exists(), "lab of {node} is not up");
    Ok((dir.join(format!("{node}.netem.pid")), dir.join(format!("{node}.netem.log"))))
}

/// `iptables -w OP INPUT <our rule>` in the node; true when it succeeded.
fn iptables(node: &str, op: &str) -> Result<bool> {
    let rule = ["!", "-i", "lo", "-j", "NFQUEUE", "--queue-num", QUEUE, "--queue-bypass"];
    let status = Command::new("ip")
        .args(["netns", "exec", node, "iptables", "-w", op, "INPUT"])
        .args(rule)
        .stderr(Stdio::null())
        .status()
        .context("cannot run iptables (is it installed?)")?;
    Ok(status.success())
}

fn clear(node: &str) -> Result<()> {
    let (pid_file, _) = files(node)?;
    for _ in 0..RULES_MAX {
        if !iptables(node, "-D")? {
            break;
        }
    }
    if let Some(pid) = procs::read_pid(&pid_file, HOLDER) {
        procs::stop(&[pid]);
    }
    let _ = std::fs::remove_file(&pid_file);
    Ok(())
}

fn start(node: &str, delay_ms: u64, loss_ppm: u32) -> Result<()> {
    let (pid_file, log) = files(node)?;
    let ready = pid_file.with_extension("ready");
    let _ = std::fs::remove_file(&ready);
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg(HOLDER).args(["--queue", QUEUE, "--delay-ms", &delay_ms.to_string()]);
    cmd.args(["--loss-ppm", &loss_ppm.to_string()]).arg("--ready").arg(&ready);
    procs::in_node(&mut cmd, node)?;
    procs::detach(&mut cmd, &log)?;
    let mut child = cmd.spawn().context("cannot start the packet holder")?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !ready.exists() {
        if let Some(status) = child.try_wait()? {
            let why = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("the packet holder in {node} ended ({status}): {}", why.trim_end());
        }
        if Instant::now() >= deadline {
            procs::stop(&[child.id() as i32]);
            bail!("the packet holder in {node} did not bind its queue in {READY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_file(&ready);
    std::fs::write(&pid_file, format!("{}\n", child.id()))?;
    // Appended: drop rules a test put first still see every packet.
    if !iptables(node, "-A")? {
        procs::stop(&[child.id() as i32]);
        bail!("iptables in {node} refused the NFQUEUE rule");
    }
    Ok(())
}
