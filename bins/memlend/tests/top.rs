//! `memlend top` in a real terminal: tmux runs it while a program borrows
//! far memory, and the screen (capture-pane) shows that program with a
//! fault rate; `q` (send-keys) ends it.

#[allow(dead_code)]
#[path = "run/common.rs"]
mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A tmux server of the test's own (`-L`), killed on every exit path.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The pid of the program `memlend run` (pid `run_pid`) started.
fn child_of(run_pid: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{run_pid}/task/{run_pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

/// The STORE/s column of `pid`'s row on the screen, if it shows a number.
fn store_rate(screen: &str, pid: u32) -> Option<f64> {
    let line = screen.lines().find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))?;
    // The row sits inside the box's border: one character, then the text.
    let row: Vec<char> = line.chars().skip(1).collect();
    let field: String = row.get(48..57)?.iter().collect();
    field.trim().parse().ok()
}

#[test]
fn top_shows_a_borrowing_program_and_quits_on_q() {
    if !Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success()) {
        return memlend_testskip::skip("tmux is not installed");
    }
    let donor = Donor::start("256M");
    let touch =
        "import time\nb = bytearray(64 << 20)\nt = time.time()\nwhile time.time() - t < 60:\n    \
                 for i in range(0, len(b), 4096): b[i] = (b[i] + 1) % 256\n";
    let run = Command::new(MEMLEND)
        .arg("run")
        .arg("--preload")
        .arg(shim())
        .args(["--local", "16M", "--donor", &donor.addr.to_string(), "--insecure", "--"])
        .args(["python3", "-c", touch])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = Reaped(run);
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Some(pid) = child_of(run.0.id()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "memlend run started no program");
        std::thread::sleep(Duration::from_millis(50));
    };

    let tmux = Tmux { socket: format!("mltest-top-{}", std::process::id()) };
    let top = format!("{MEMLEND} top --interval-ms 300");
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "220", "-y", "50", &top]);
    assert!(started.status.success(), "tmux: {}", text(&started.stderr));
    let deadline = Instant::now() + Duration::from_secs(15);
    let screen = loop {
        let screen = text(&tmux.run(&["capture-pane", "-p", "-t", "top"]).stdout);
        if store_rate(&screen, pid).is_some_and(|r| r > 0.0) {
            break screen;
        }
        assert!(Instant::now() < deadline, "no fault rate for pid {pid} on the screen:\n{screen}");
        std::thread::sleep(Duration::from_millis(200));
    };
    for want in ["memlend top", "q to quit", "STORE/s", "MISS p50", "python3", "donor 127.0.0.1"] {
        assert!(screen.contains(want), "{want:?} is not on the screen:\n{screen}");
    }

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(Instant::now() < deadline, "memlend top did not quit on q");
        std::thread::sleep(Duration::from_millis(50));
    }
}
