//! `memlend lab` and `memlend balloon` on this machine: namespaces on a
//! bridge that carry unicast and broadcast UDP, per-node memory cgroups a
//! balloon really fills, and a `lab down` that leaves no trace. Needs root
//! and iproute2; skipped (with the reason printed) otherwise. Each test has
//! its own prefix so they run in parallel, and a guard takes its lab down
//! on every exit path.

mod labkit;

use labkit::{cgroup_file, cgroups_dir, memlend, ok, text, Lab, MEMLEND};
use memlend_host::cgroup::File;
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
/// The UDP helper's job, set when this test binary is re-run in a node.
const UDP_ENV: &str = "MEMLEND_LAB_TEST_UDP";

/// Nothing named after `prefix` is left: namespaces, links, cgroups, state.
fn assert_no_trace(prefix: &str) {
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let ours = |s: &str| s.contains(&format!("{prefix}-")) || s.contains(&format!("{prefix}br0"));
    assert!(!text(&ns.stdout).lines().any(ours), "namespaces left: {}", text(&ns.stdout));
    assert!(!text(&links.stdout).lines().any(ours), "links left: {}", text(&links.stdout));
    let cgroups: Vec<String> = std::fs::read_dir(cgroups_dir())
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !cgroups.iter().any(|c| c.starts_with(&format!("{prefix}-"))),
        "cgroups left: {cgroups:?}"
    );
    assert!(!Path::new(&format!("/run/memlend-lab-{prefix}")).exists(), "state dir left");
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    // A holder's command line names its lab's state directory.
    let dir = format!("/run/memlend-lab-{prefix}/");
    for holder in ["balloon-hold", "netem-hold"] {
        let held = text(&ps.stdout).lines().any(|l| l.contains(holder) && l.contains(&dir));
        assert!(!held, "a {holder} of {prefix} is still running");
    }
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
    assert_eq!(cgroup_file(&lab.node(2), File::Limit), 256 << 20);
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
fn status_finds_a_lab_node_by_name_and_points_a_newcomer_to_it() {
    need_lab!();
    let lab = Lab::up_with_daemons("tsta", 2, "256M", "10.79.9.0/24");
    let (n1, n2) = (lab.node(1), lab.node(2));
    // The daemons may take a moment to open their sockets and meet.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let table = loop {
        let out = memlend(&["status", "--node", &n1]);
        let table = text(&out.stdout);
        if out.status.success() && table.contains(&n2) {
            break table;
        }
        assert!(std::time::Instant::now() < deadline, "status --node {n1}: {out:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(table.contains(&format!("{n1} ")) && table.contains("(this node)"), "{table}");
    // memlend top draws the same node from the same socket.
    let top = text(&memlend(&["top", "--once", "--node", &n1]).stdout);
    assert!(top.contains("CLASS") && top.contains(&n2) && top.contains("(this node)"), "{top}");
    let bad = memlend(&["status", "--node", "tsta-n9"]);
    assert!(!bad.status.success() && text(&bad.stderr).contains(&n1), "{bad:?}");
    if !Path::new("/run/memlend/memlendd.sock").exists() {
        let bare = memlend(&["status"]);
        let err = text(&bare.stderr);
        assert!(!bare.status.success() && err.contains("memlend status --node"), "{err}");
    }
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

/// Move this thread (only) into `node`'s network namespace.
fn enter(node: &str) {
    let ns = std::fs::File::open(format!("/run/netns/{node}")).unwrap();
    // SAFETY: setns(2) on a namespace descriptor we own; it changes only the
    // calling thread's network namespace and touches no memory of ours.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {node}: {}", std::io::Error::last_os_error());
}

/// `n` UDP round trips from `from` to an echo in `to` (10.77.0.12:7420),
/// each given `timeout`: (median round trip in ms, how many were lost).
fn round_trips(from: &str, n: usize, timeout: Duration) -> (f64, usize) {
    let from = from.to_string();
    std::thread::spawn(move || {
        enter(&from);
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.set_read_timeout(Some(timeout)).unwrap();
        let (mut rtts, mut lost, mut buf) = (Vec::new(), 0, [0u8; 16]);
        for i in 0..n as u64 {
            let t = std::time::Instant::now();
            sock.send_to(&i.to_le_bytes(), "10.77.0.12:7420").unwrap();
            // A late echo of an earlier probe is not this one's answer.
            let answered = loop {
                match sock.recv(&mut buf) {
                    Ok(8) if buf[..8] == i.to_le_bytes() => break true,
                    Ok(_) => continue,
                    Err(_) => break false,
                }
            };
            match answered {
                true => rtts.push(t.elapsed().as_secs_f64() * 1e3),
                false => lost += 1,
            }
        }
        rtts.sort_by(f64::total_cmp);
        (rtts.get(rtts.len() / 2).copied().unwrap_or(f64::NAN), lost)
    })
    .join()
    .unwrap()
}

/// tc netem's job without sch_netem: packets arriving at a shaped node are
/// held (a round trip between two shaped nodes grows by twice the delay)
/// or dropped; --clear and lab down undo it.
#[test]
fn netem_delays_and_drops_arriving_packets_and_clear_undoes_it() {
    need_lab!();
    let lab = Lab::up("tdly", 2, "256M");
    let (a, b) = (lab.node(1), lab.node(2));
    let (echo_node, stop) = (b.clone(), Arc::new(AtomicBool::new(false)));
    let stopped = Arc::clone(&stop);
    let (bound_tx, bound) = std::sync::mpsc::channel();
    let echo = std::thread::spawn(move || {
        enter(&echo_node);
        let sock = UdpSocket::bind("0.0.0.0:7420").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        bound_tx.send(()).unwrap();
        let mut buf = [0u8; 16];
        while !stopped.load(Ordering::Relaxed) {
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(&buf[..n], from);
            }
        }
    });
    bound.recv().unwrap(); // a probe before the bind would be lost
    let (base_ms, lost) = round_trips(&a, 20, Duration::from_secs(1));
    assert!(base_ms < 5.0 && lost == 0, "unshaped: {base_ms} ms, {lost} lost");

    ok(&["lab", "netem", &a, &b, "--delay-ms", "20"]);
    let (slow_ms, lost) = round_trips(&a, 20, Duration::from_secs(1));
    assert!((40.0..60.0).contains(&slow_ms) && lost == 0, "20 ms each way: {slow_ms} ms, {lost}");

    // 30% at each end: a round trip survives with p = 0.49.
    ok(&["lab", "netem", &a, &b, "--loss-pct", "30"]);
    let (_, lost) = round_trips(&a, 100, Duration::from_millis(100));
    assert!((25..=80).contains(&lost), "30% loss each way lost {lost} of 100 round trips");

    ok(&["lab", "netem", &a, &b, "--clear"]);
    let (after_ms, lost) = round_trips(&a, 20, Duration::from_secs(1));
    assert!(after_ms < 5.0 && lost == 0, "cleared: {after_ms} ms, {lost} lost");

    let bad = memlend(&["lab", "netem", &a, "--delay-ms", "10001"]);
    assert!(!bad.status.success() && text(&bad.stderr).contains("10000"));
    ok(&["lab", "netem", &a, "--delay-ms", "5"]);
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap(); // out of the namespace before it goes
    ok(&["lab", "down", "--prefix", "tdly"]);
    assert_no_trace("tdly");
}
