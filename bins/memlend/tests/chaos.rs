//! Chaos in the lab: a borrower in one namespace keeps its pages mirrored
//! on donors in three others while a donor is killed, stopped, cut off or
//! loses packets, or while the SSD under a copy fills up. Each test asserts
//! that every page reads back as written, that no page was lost, and how
//! long the program paused; it prints one `chaos:` line for
//! docs/reliability.md. Needs root (skipped otherwise, with the reason).
//! The tests take turns: each brings up four nodes and runs four daemons,
//! and two cores shared by several labs would turn timeouts into noise.

mod labkit;

use labkit::{Lab, MEMLEND};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
const PORT: u16 = 7070;
/// The whole run, chaos included, must end within this.
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn memlendd() -> PathBuf {
    Path::new(MEMLEND).with_file_name("memlendd")
}

/// A process of the test, killed (and continued first, if stopped) when
/// the test ends on any path.
struct Proc(Child);

impl Proc {
    fn signal(&self, sig: &str) {
        let pid = self.0.id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-CONT", &pid]).stderr(Stdio::null()).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Four nodes: n1 borrows, n2..n4 lend.
struct Cluster {
    lab: Lab,
    net: u8,
    donors: Vec<Proc>,
}

impl Cluster {
    fn up(prefix: &'static str, net: u8) -> Cluster {
        let lab = Lab::up_in(prefix, 4, "1G", &format!("10.81.{net}.0/24"));
        let mut c = Cluster { lab, net, donors: Vec::new() };
        for i in 2..=4 {
            let child = Command::new("ip")
                .args(["netns", "exec", &c.lab.node(i)])
                .arg(memlendd())
                .args(["--lend", "256M", "--insecure", "--listen", &c.addr(i)])
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            c.donors.push(Proc(child));
        }
        for i in 2..=4 {
            c.wait_listening(i);
        }
        c
    }

    fn addr(&self, i: usize) -> String {
        format!("10.81.{}.{}:{PORT}", self.net, 10 + i)
    }

    fn donor(&self, i: usize) -> &Proc {
        &self.donors[i - 2]
    }

    fn in_node(&self, i: usize, cmd: &[&str]) -> bool {
        let ns = self.lab.node(i);
        Command::new("ip").args(["netns", "exec", &ns]).args(cmd).status().unwrap().success()
    }

    fn wait_listening(&self, i: usize) {
        let port = format!(":{PORT:04X} ");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ns = self.lab.node(i);
            let tcp =
                Command::new("ip").args(["netns", "exec", &ns, "cat", "/proc/net/tcp"]).output();
            let out = String::from_utf8(tcp.unwrap().stdout).unwrap();
            if out.lines().any(|l| l.contains(&port) && l.split_whitespace().nth(3) == Some("0A")) {
                return;
            }
            assert!(Instant::now() < deadline, "donor in node {i} did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `memlend far` in n1 over the three donors, its stdout lines on a
    /// channel.
    fn far(&self, size: &str, extra: &[&str]) -> (Proc, Receiver<String>) {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.lab.node(1), MEMLEND, "far", "--insecure"])
            .args(["--donor", &self.addr(2), "--also", &self.addr(3), "--also", &self.addr(4)])
            .args(["--size", size, "--local", "8M", "--random-passes", "0", "--hold-s", "8"])
            .args(extra);
        spawn_lines(cmd)
    }
}

/// Its stdout lines, and its stderr lines behind `STDERR` (so that a
/// failure shows the reason).
fn spawn_lines(mut cmd: Command) -> (Proc, Receiver<String>) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (tx, rx) = channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx2.send(format!("{STDERR}{line}"));
        }
    });
    (Proc(child), rx)
}

const STDERR: &str = "stderr: ";

/// Lines until one contains `what` (which is returned with those before).
fn wait_line(rx: &Receiver<String>, what: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| panic!("no {what:?} in {seen:#?}"));
        let done = line.contains(what);
        seen.push(line);
        if done {
            return;
        }
    }
}

/// What a run reported at its end.
#[derive(Debug)]
struct Outcome {
    pause_ms: u64,
    legs_failed: u64,
    rebuilt: u64,
    lost: u64,
    differ: u64,
}

/// The rest of the run: it must succeed; its summary is parsed.
fn finish(mut far: Proc, rx: &Receiver<String>, mut seen: Vec<String>) -> Outcome {
    wait_line(rx, "pages differ", &mut seen);
    let status = far.0.wait().unwrap();
    let all = seen.join("\n");
    assert!(status.success(), "memlend far failed ({status}):\n{all}");
    // The number just before `key` on the line that has `line_key`.
    let number = |line_key: &str, key: &str| -> u64 {
        let line = seen.iter().find(|l| !l.starts_with(STDERR) && l.contains(line_key));
        let line = line.unwrap_or_else(|| panic!("{line_key}: {all}"));
        let before = line[..line.find(key).unwrap()].trim_end();
        let digits = before.rsplit(|c: char| !c.is_ascii_digit()).next().unwrap();
        digits.parse().unwrap_or_else(|_| panic!("no number before {key:?} in {line:?}"))
    };
    let num = |key: &str| number(key, key);
    let pause_line = seen.iter().find(|l| l.starts_with("  longest touch")).expect("pause line");
    let pause_ms = pause_line.split_whitespace().rev().nth(1).unwrap().parse().unwrap();
    Outcome {
        pause_ms,
        legs_failed: num(" legs failed"),
        rebuilt: num(" rebuilt ("),
        lost: num(" pages lost"),
        differ: number(" pages differ", " of "),
    }
}

fn report(name: &str, o: &Outcome) {
    println!(
        "chaos: {name}: longest pause {} ms; {} legs failed, {} rebuilt; {} pages lost, {} differ",
        o.pause_ms, o.legs_failed, o.rebuilt, o.lost, o.differ
    );
    assert_eq!((o.lost, o.differ), (0, 0), "{name}: pages lost");
}

/// Run `far` with mirrors, inject `fault` two seconds into the hold.
fn mirrored_run(c: &Cluster, name: &str, fault: impl FnOnce(&Cluster)) -> Outcome {
    redundant_run(c, "128M", &["--redundancy", "mirror"], name, fault)
}

fn redundant_run(
    c: &Cluster,
    size: &str,
    args: &[&str],
    name: &str,
    fault: impl FnOnce(&Cluster),
) -> Outcome {
    let (far, rx) = c.far(size, args);
    let mut seen = Vec::new();
    wait_line(&rx, "held 2 s", &mut seen);
    fault(c);
    let o = finish(far, &rx, seen);
    report(name, &o);
    o
}

macro_rules! chaos_test {
    () => {
        crate::need_lab!();
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    };
}

#[test]
fn kill_9_of_a_donor_loses_nothing() {
    chaos_test!();
    let c = Cluster::up("ckill", 1);
    let o = mirrored_run(&c, "kill -9 of a donor", |c| c.donor(3).signal("-KILL"));
    assert!(o.legs_failed >= 1 && o.rebuilt >= 1, "{o:?}");
    assert!(o.pause_ms < 1000, "{o:?}");
}

#[test]
fn kill_9_of_a_donor_under_erasure_coding_loses_nothing() {
    chaos_test!();
    let c = Cluster::up("cerase", 6);
    let args = ["--redundancy", "erasure"];
    let o = redundant_run(&c, "128M", &args, "kill -9 of a donor, erasure coded 2+1", |c| {
        c.donor(3).signal("-KILL")
    });
    assert!(o.legs_failed == 1, "{o:?}");
    assert!(o.rebuilt == 1, "the lost shard was not rebuilt (on the SSD: no fourth donor): {o:?}");
}

#[test]
fn sigstop_of_a_donor_fails_over_within_a_second() {
    chaos_test!();
    let c = Cluster::up("cstop", 2);
    let o = mirrored_run(&c, "SIGSTOP of a donor", |c| c.donor(3).signal("-STOP"));
    assert!(o.legs_failed >= 1 && o.rebuilt >= 1, "{o:?}");
    assert!(o.pause_ms < 1000, "the docs promise a pause under a second: {o:?}");
}

#[test]
fn a_link_down_for_5_s_loses_nothing() {
    chaos_test!();
    let c = Cluster::up("clink", 3);
    let veth = format!("{}-v3", c.lab.prefix);
    let o = mirrored_run(&c, "link down 5 s", |_| {
        assert!(Command::new("ip")
            .args(["link", "set", &veth, "down"])
            .status()
            .unwrap()
            .success());
        std::thread::sleep(Duration::from_secs(5));
        assert!(Command::new("ip").args(["link", "set", &veth, "up"]).status().unwrap().success());
    });
    assert!(o.legs_failed >= 1, "{o:?}");
}

#[test]
fn five_percent_loss_loses_nothing() {
    chaos_test!();
    let c = Cluster::up("closs", 4);
    for chain in ["INPUT", "OUTPUT"] {
        let rule = ["iptables", "-I", chain, "-m", "statistic", "--mode", "random"];
        assert!(c.in_node(1, &[&rule[..], &["--probability", "0.05", "-j", "DROP"]].concat()));
    }
    // Smaller: every TCP segment lost costs a retransmission timeout.
    redundant_run(&c, "32M", &["--redundancy", "mirror"], "5% packet loss at the borrower", |_| {});
}

/// 5% of packets lost each way at the borrower, and every packet it
/// receives held 50 ms (`lab netem`; this kernel has no sch_netem).
/// It failed 1 of its first 4 runs (in CI): retransmission backoff at a
/// 100 ms round trip passed the 800 ms leg timeout often enough that both
/// copies of a chunk were dropped, and the mirror had no healthy leg left
/// although both donors held the pages. Since a mirror never drops its
/// last healthy leg (that operation fails, the next tries the leg again),
/// it passed 10 runs of 10.
#[test]
fn five_percent_loss_with_50ms_delay_loses_nothing() {
    chaos_test!();
    let c = Cluster::up("cdly", 8);
    let rule = ["iptables", "-I", "OUTPUT", "-m", "statistic", "--mode", "random"];
    assert!(c.in_node(1, &[&rule[..], &["--probability", "0.05", "-j", "DROP"]].concat()));
    let n1 = c.lab.node(1);
    labkit::ok(&["lab", "netem", &n1, "--delay-ms", "50", "--loss-pct", "5"]);
    // Small: every round trip is 50 ms, every lost segment a retransmission.
    let name = "5% loss each way, 50 ms delay at the borrower";
    redundant_run(&c, "16M", &["--redundancy", "mirror"], name, |_| {});
}

/// Exactly once, in the lab, with no second copy anywhere: the donor's end
/// of the borrower's connections is destroyed (`ss -K`, so the borrower
/// gets a reset) four times while it touches and checks pages, then the
/// donor's link goes down for 2 s. Each cut must end in a resumed session
/// (unanswered requests sent again, none applied twice) and every page
/// must read back.
#[test]
fn cut_connections_and_a_link_down_lose_no_write_and_double_none() {
    chaos_test!();
    let c = Cluster::up("ccut", 7);
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &c.lab.node(1), MEMLEND, "far", "--insecure"])
        .args(["--donor", &c.addr(2), "--size", "64M", "--local", "8M"])
        .args(["--random-passes", "0", "--hold-s", "8"]);
    let (mut far, rx) = spawn_lines(cmd);
    let mut seen = Vec::new();
    wait_line(&rx, "held 1 s", &mut seen);
    for _ in 0..4 {
        let kill = ["ss", "-K", "-t", "sport", "=", &format!(":{PORT}")];
        assert!(c.in_node(2, &kill));
        std::thread::sleep(Duration::from_millis(700));
    }
    let veth = format!("{}-v2", c.lab.prefix);
    let link = |state: &str| Command::new("ip").args(["link", "set", &veth, state]).status();
    assert!(link("down").unwrap().success());
    std::thread::sleep(Duration::from_secs(2));
    assert!(link("up").unwrap().success());
    wait_line(&rx, "pages differ", &mut seen);
    let status = far.0.wait().unwrap();
    let all = seen.join("\n");
    assert!(status.success(), "memlend far failed ({status}):\n{all}");
    assert!(all.contains(" 0 of 16384 pages differ"), "{all}");
    let resumes = seen.iter().filter(|l| l.contains("session resumed")).count();
    assert!(resumes >= 1, "no connection was resumed:\n{all}");
    println!("chaos: 4 connection cuts and a 2 s link down, no second copy: {resumes} resumes, 0 pages differ");
}

/// A tmpfs of `size`, unmounted and removed when the test ends.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn new(name: &str, size: &str) -> SmallDisk {
        let dir = std::env::temp_dir().join(format!("memlend-chaos-{name}"));
        let _ = Command::new("umount").arg(&dir).stderr(Stdio::null()).status();
        std::fs::create_dir_all(&dir).unwrap();
        let disk = SmallDisk(dir);
        let opts = format!("size={size}");
        let mount =
            Command::new("mount").args(["-t", "tmpfs", "-o", &opts, "tmpfs"]).arg(&disk.0).status();
        assert!(mount.unwrap().success(), "cannot mount a tmpfs");
        disk
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_full_disk_under_the_ssd_copy_loses_nothing() {
    chaos_test!();
    let c = Cluster::up("cdisk", 5);
    let disk = SmallDisk::new("backup", "8M");
    let ssd = disk.0.to_str().unwrap();
    let args = ["--redundancy", "ssd", "--ssd", ssd];
    let o = redundant_run(&c, "64M", &args, "full disk under the SSD copy", |_| {});
    assert!(o.legs_failed >= 1 && o.rebuilt >= 1, "the full disk was not noticed: {o:?}");
}

#[test]
fn a_full_disk_as_the_only_store_is_a_clear_error() {
    chaos_test!();
    let disk = SmallDisk::new("only", "8M");
    let out = Command::new(MEMLEND)
        .args(["far", "--size", "64M", "--local", "8M", "--ssd"])
        .arg(&disk.0)
        .output()
        .unwrap();
    let (err, text) = (String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    assert!(!out.status.success(), "a 64M region fitted in an 8M disk?");
    assert!(err.contains("No space left on device"), "no clear reason: {err}");
    assert!(err.lines().count() < 20, "the log is flooded: {} lines", err.lines().count());
    // Pages the disk refused stay in memory: none is lost or wrong.
    assert!(text.contains(" 0 of 16384 pages differ"), "{text}");
    assert!(text.contains("over budget"), "{text}");
    println!(
        "chaos: full disk as the only store: refused, 0 pages differ, {} log lines",
        err.lines().count()
    );
}
