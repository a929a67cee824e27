//! Processes in a node: started inside its network namespace and memory
//! cgroup, and stopped by pid with a bounded wait.

use super::cgroup;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a process gets between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// Make `cmd` start inside `node`: the child joins the node's cgroup and
/// network namespace between fork and exec, so the program's first page is
/// already charged to the node and its first socket is already in the node.
pub fn in_node(cmd: &mut Command, node: &str) -> Result<()> {
    let ns_path = format!("/run/netns/{node}");
    let ns =
        File::open(&ns_path).with_context(|| format!("no namespace {ns_path}: is the lab up?"))?;
    let procs_path = cgroup::dir(node).join("cgroup.procs");
    let procs = OpenOptions::new()
        .write(true)
        .open(&procs_path)
        .with_context(|| format!("cannot open {}", procs_path.display()))?;
    // SAFETY: the hook runs in the forked child before exec; it only makes
    // the write(2) and setns(2) system calls on descriptors opened above,
    // which allocates nothing and takes no locks.
    unsafe { cmd.pre_exec(move || enter(&ns, &procs)) };
    Ok(())
}

fn enter(ns: &File, procs: &File) -> std::io::Result<()> {
    // Writing pid 0 to cgroup.procs moves the writer itself (v1 and v2).
    (&*procs).write_all(b"0")?;
    // SAFETY: setns(2) on a namespace file descriptor we own; it touches no
    // memory of ours.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Start `cmd` detached: own process group (a Ctrl-C at the terminal does
/// not reach it), stdin closed, stdout and stderr to `log`.
pub fn detach(cmd: &mut Command, log: &Path) -> Result<()> {
    let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    cmd.stdin(std::process::Stdio::null()).stdout(out.try_clone()?).stderr(out).process_group(0);
    Ok(())
}

/// Alive and not a zombie (killed children of a parent that has not reaped
/// them yet count as gone: their memory is already freed).
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// Whether the process's command line mentions `what`, so a pid file left
/// over from an earlier boot never gets an unrelated process killed.
pub fn runs(pid: i32, what: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&cmdline).contains(what)
}

pub fn signal(pid: i32, sig: i32) {
    if pid > 1 {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { libc::kill(pid, sig) };
    }
}

/// SIGTERM, wait up to GRACE, then SIGKILL and wait up to 2 s more.
/// Returns the pids still alive after all that.
pub fn stop(pids: &[i32]) -> Vec<i32> {
    pids.iter().for_each(|&p| signal(p, libc::SIGTERM));
    if wait_gone(pids, GRACE) {
        return Vec::new();
    }
    pids.iter().filter(|&&p| alive(p)).for_each(|&p| signal(p, libc::SIGKILL));
    wait_gone(pids, Duration::from_secs(2));
    pids.iter().copied().filter(|&p| alive(p)).collect()
}

fn wait_gone(pids: &[i32], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if pids.iter().all(|&p| !alive(p)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid in a pid file, if it names a live process running `what`.
pub fn read_pid(file: &Path, what: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    (alive(pid) && runs(pid, what)).then_some(pid)
}
