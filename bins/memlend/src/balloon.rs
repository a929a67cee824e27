//! `memlend balloon SIZE [--node NODE]`: hold SIZE of real memory in a
//! detached process (on the host or in a lab node's cgroup) so memory
//! pressure can be made on demand; `--release` (or SIZE 0) frees it.
//! The holder is this binary re-run as the hidden `balloon-hold`.

use crate::lab::{procs, state};
use anyhow::{bail, Context, Result};
use clap::Args;
use memlend_node::size::{human, parse_size};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Marker in the holder's command line, so a pid file can be trusted.
const HOLDER: &str = "balloon-hold";

#[derive(Args, Debug)]
pub struct BalloonArgs {
    /// How much memory to hold (e.g. 64M, 2G); 0 releases.
    #[arg(value_parser = parse_size, required_unless_present = "release")]
    size: Option<u64>,
    /// Hold it inside this lab node's namespace and cgroup (e.g. ml-n1).
    #[arg(long)]
    node: Option<String>,
    /// Stop the balloon and free its memory.
    #[arg(long)]
    release: bool,
}

#[derive(Args, Debug)]
pub struct HoldArgs {
    #[arg(value_parser = parse_size)]
    size: u64,
    /// Written once every page is touched: the caller waits for it.
    #[arg(long)]
    ready: PathBuf,
}

pub fn run(a: &BalloonArgs) -> Result<()> {
    let (pid_file, log) = files(a.node.as_deref())?;
    let where_ = a.node.as_deref().unwrap_or("the host");
    if let Some(pid) = procs::read_pid(&pid_file, HOLDER) {
        procs::stop(&[pid]);
        println!("released the balloon on {where_} (pid {pid})");
    }
    let _ = std::fs::remove_file(&pid_file);
    match a.size {
        Some(size) if size > 0 && !a.release => inflate(size, a.node.as_deref(), &pid_file, &log),
        _ => Ok(()),
    }
}

/// The pid file and log: beside the lab's state for a node, else in
/// /run/memlend for the host.
fn files(node: Option<&str>) -> Result<(PathBuf, PathBuf)> {
    match node {
        Some(node) => {
            let pid = state::balloon_pid_file(node)?;
            anyhow::ensure!(pid.parent().is_some_and(Path::exists), "lab of {node} is not up");
            Ok((pid.clone(), pid.with_extension("log")))
        }
        None => {
            std::fs::create_dir_all("/run/memlend").context("cannot create /run/memlend")?;
            Ok(("/run/memlend/balloon.pid".into(), "/run/memlend/balloon.log".into()))
        }
    }
}

fn inflate(size: u64, node: Option<&str>, pid_file: &Path, log: &Path) -> Result<()> {
    let ready = pid_file.with_extension("ready");
    let _ = std::fs::remove_file(&ready);
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg(HOLDER).arg(size.to_string()).arg("--ready").arg(&ready);
    if let Some(node) = node {
        procs::in_node(&mut cmd, node)?;
    }
    procs::detach(&mut cmd, log)?;
    let mut child = cmd.spawn().context("cannot start the balloon")?;
    // Touching pages runs at GB/s; allow a generous 10 s plus 5 s per GiB.
    let timeout = Duration::from_secs(10 + 5 * (size >> 30));
    let deadline = Instant::now() + timeout;
    while !ready.exists() {
        if let Some(status) = child.try_wait()? {
            let mut why = std::fs::read_to_string(log).unwrap_or_default();
            if status.signal() == Some(libc::SIGKILL) {
                why += " (killed: more than the node's memory limit allows?)";
            }
            bail!("the balloon ended before holding {} ({status}){}", human(size), why.trim_end());
        }
        if Instant::now() >= deadline {
            procs::stop(&[child.id() as i32]);
            bail!("the balloon did not hold {} within {timeout:?}", human(size));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let how = std::fs::read_to_string(&ready).unwrap_or_default();
    let _ = std::fs::remove_file(&ready);
    std::fs::write(pid_file, format!("{}\n", child.id()))?;
    let where_ = node.unwrap_or("the host");
    println!("balloon of {} held on {where_} by pid {} ({})", human(size), child.id(), how.trim());
    Ok(())
}

/// The holder: allocate, touch every page, try to lock, say so, then wait
/// to be killed.
pub fn hold(a: &HoldArgs) -> Result<()> {
    let size = usize::try_from(a.size).context("size too large")?;
    let mut buf = vec![0u8; size];
    // The zeroed allocation is mapped lazily; a write per page makes each
    // one real (and charged to our cgroup).
    for i in (0..size).step_by(4096) {
        buf[i] = 1;
    }
    let how = lock(&buf);
    let tmp = a.ready.with_extension("tmp");
    std::fs::write(&tmp, format!("{how}\n"))?;
    std::fs::rename(&tmp, &a.ready)?;
    // Held until SIGTERM/SIGKILL ends the process: that is this loop's only
    // way out, by design.
    loop {
        std::hint::black_box(&buf);
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// mlock the pages so they cannot be swapped out; touching alone is enough
/// for the cgroup charge, so a refusal (RLIMIT_MEMLOCK) is only noted.
fn lock(buf: &[u8]) -> String {
    // SAFETY: mlock(2) on the address range of a live allocation we own.
    let rc = unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) };
    if rc == 0 {
        "touched and mlocked".into()
    } else {
        let err = std::io::Error::last_os_error();
        format!("touched; mlock failed ({err}), so the pages may be swapped")
    }
}
