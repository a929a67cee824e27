//! `memlend lab` and `memlend balloon` on this machine: namespaces on a
//! bridge that carry unicast and broadcast UDP, per-node memory cgroups a
//! balloon really fills, and a `lab down` that leaves no trace. Needs root
//! and iproute2; skipped (with the reason printed) otherwise. Each test has
//! its own prefix so they run in parallel, and a guard takes its lab down
//! on every exit path.

mod labkit;

use labkit::{cgroup_file, memlend, ok, text, Lab, MEMLEND};
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
const CGROUPS: &str = "/sys/fs/cgroup/memory/memlend-lab";
/// The UDP helper's job, set when this test binary is re-run in a node.
const UDP_ENV: &str = "MEMLEND_LAB_TEST_UDP";

/// Nothing named after `prefix` is left: namespaces, links, cgroups, state.
fn assert_no_trace(prefix: &str) {
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let ours = |s: &str| s.contains(&format!("{prefix}-")) || s.contains(&format!("{prefix}br0"));
    assert!(!text(&ns.stdout).lines().any(ours), "namespaces left: {}", text(&ns.stdout));
    assert!(!text(&links.stdout).lines().any(ours), "links left: {}", text(&links.stdout));
    let cgroups: Vec<String> = std::fs::read_dir(CGROUPS)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !cgroups.iter().any(|c| c.starts_with(&format!("{prefix}-"))),
        "cgroups left: {cgroups:?}"
    );
    assert!(!Path::new(&format!("/run/memlend-lab-{prefix}")).exists(), "state dir left");
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let held = text(&ps.stdout).lines().any(|l| l.contains("balloon-hold") && l.contains(prefix));
    assert!(!held, "a balloon of {prefix} is still running");
}

/// Re-run this test binary's UDP helper inside `node` via `lab exec`.
fn udp_in(node: &str, job: &str) -> Child {
    let me = std::env::current_exe().unwrap();
    Command::new(MEMLEND)
        .args(["lab", "exec", node, "--"])
        .arg(me)
        .args(["udp_helper", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(UDP_ENV, job)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `recv PORT`: print the first datagram (5 s timeout). `send ADDR`: send
/// 30 datagrams 100 ms apart (broadcast allowed), so a receiver that binds
/// a moment late still gets one.
#[test]
#[ignore = "run by the lab tests inside a node"]
fn udp_helper() {
    let Ok(job) = std::env::var(UDP_ENV) else { return };
    let (what, arg) = job.split_once(' ').unwrap();
    if what == "recv" {
        let sock = UdpSocket::bind(("0.0.0.0", arg.parse::<u16>().unwrap())).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = sock.recv_from(&mut buf).expect("no datagram within 5 s");
        println!("GOT {} FROM {}", text(&buf[..n]), from.ip());
    } else {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.set_broadcast(true).unwrap();
        for _ in 0..30 {
            sock.send_to(b"hello-lab", arg).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn received(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "receiver failed: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn three_nodes_talk_unicast_and_broadcast_then_leave_no_trace() {
    need_lab!();
    let lab = Lab::up("tnet", 3, "256M");
    assert_eq!(cgroup_file(&lab.node(2), "memory.limit_in_bytes"), 256 << 20);
    let (r2, r3) = (udp_in(&lab.node(2), "recv 7411"), udp_in(&lab.node(3), "recv 7412"));
    let s1 = udp_in(&lab.node(1), "send 10.77.0.12:7411");
    let s2 = udp_in(&lab.node(1), "send 10.77.0.255:7412");
    assert!(received(r2).contains("GOT hello-lab FROM 10.77.0.11"), "unicast n1 -> n2 lost");
    assert!(received(r3).contains("GOT hello-lab FROM 10.77.0.11"), "broadcast n1 -> n3 lost");
    let _ = (s1.wait_with_output(), s2.wait_with_output());

    assert!(ok(&["lab", "up", "3", "--no-daemon", "--prefix", "tnet"]).contains("already up"));
    let other = memlend(&["lab", "up", "2", "--no-daemon", "--prefix", "tnet"]);
    assert!(!other.status.success() && text(&other.stderr).contains("lab down"));
    assert!(ok(&["lab", "status", "--prefix", "tnet"]).contains("10.77.0.13"));

    ok(&["lab", "down", "--prefix", "tnet"]);
    assert_no_trace("tnet");
    assert!(ok(&["lab", "down", "--prefix", "tnet"]).contains("nothing to remove"));
}

#[test]
fn a_balloon_fills_its_node_cgroup_and_release_empties_it() {
    need_lab!();
    let lab = Lab::up("tbal", 2, "512M");
    let before = lab.usage(1);
    ok(&["balloon", "64M", "--node", &lab.node(1)]);
    let held = lab.usage(1);
    assert!(held >= before + (60 << 20), "usage {before} -> {held}: balloon not charged");
    assert!(lab.usage(2) < 16 << 20, "the balloon was charged to the wrong node");
    ok(&["balloon", "--release", "--node", &lab.node(1)]);
    let after = lab.usage(1);
    assert!(after + (60 << 20) <= held, "usage {held} -> {after}: release freed nothing");

    // lab exec passes the exit status through and runs in the node's cgroup.
    let code = memlend(&["lab", "exec", &lab.node(2), "--", "sh", "-c", "exit 7"]);
    assert_eq!(code.status.code(), Some(7));
    let cg = ok(&["lab", "exec", &lab.node(2), "--", "cat", "/proc/self/cgroup"]);
    assert!(cg.contains(&format!("memlend-lab/{}", lab.node(2))), "not in the cgroup: {cg}");
}

#[test]
fn down_without_the_state_file_still_removes_everything_including_a_balloon() {
    need_lab!();
    let lab = Lab::up("tlost", 2, "256M");
    ok(&["balloon", "32M", "--node", &lab.node(2)]);
    std::fs::remove_file("/run/memlend-lab-tlost/lab.json").unwrap();
    ok(&["lab", "down", "--prefix", "tlost"]);
    assert_no_trace("tlost");
}
