//! A cluster of `memlendd --cluster` on plain loopback with a seed list:
//! borrowing through the local API, a reclaim that moves a running
//! program's pages home with none lost, a stranger with another key kept
//! out, a dead borrower's lease freed, status and metrics. And the ACMS
//! Figure 6 scenario in the lab (bench/acms_fig6.py), which needs root.

use serde_json::Value;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MEMLEND: &str = env!("CARGO_BIN_EXE_memlend");

fn memlendd() -> PathBuf {
    Path::new(MEMLEND).with_file_name("memlendd")
}

fn free_tcp() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn free_udp() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

/// One daemon, killed when the test ends on any path.
struct Node {
    child: Child,
    api: PathBuf,
    metrics: u16,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start(dir: &Path, name: &str, ctrl: u16, seeds: &[u16], extra: &[&str]) -> Node {
        let api = dir.join(format!("{name}.sock"));
        // A killed daemon's socket stays behind; wait for the new one's.
        let _ = std::fs::remove_file(&api);
        let metrics = free_tcp();
        let mut cmd = Command::new(memlendd());
        cmd.args(["--cluster", "--node", name, "--lend", "1G"])
            .args(["--listen", &format!("127.0.0.1:{}", free_tcp())])
            .args(["--control", &format!("127.0.0.1:{ctrl}")])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .arg("--api")
            .arg(&api)
            .args(extra);
        let log = dir.join(format!("{name}.log"));
        cmd.stderr(std::fs::File::create(&log).unwrap());
        for s in seeds {
            cmd.args(["--seed", &format!("127.0.0.1:{s}")]);
        }
        let child = cmd.spawn().unwrap();
        let node = Node { child, api, metrics, log };
        wait(&format!("{name}'s API"), 10, || node.api.exists());
        node
    }

    /// The daemon's status. A daemon slow to answer (a loaded CI machine)
    /// is asked up to three times; one that died fails the test with its
    /// exit status and the end of its log.
    fn status(&self) -> Value {
        let mut why = String::new();
        for _ in 0..3 {
            let out = Command::new(MEMLEND)
                .args(["status", "--json", "--api"])
                .arg(&self.api)
                .output()
                .unwrap();
            if out.status.success() {
                return serde_json::from_slice(&out.stdout).unwrap();
            }
            why = String::from_utf8_lossy(&out.stderr).into_owned();
            if !self.alive() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!("the daemon is gone: {why}\n{}", tail.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("status failed three times: {why}");
    }

    /// Running (not exited, not a zombie waiting to be reaped).
    fn alive(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()));
        // The state follows the command name in parentheses.
        stat.ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().to_string()))
            .is_some_and(|rest| !rest.starts_with('Z'))
    }

    fn field(&self, name: &str) -> u64 {
        self.status()["node"][name].as_u64().unwrap()
    }

    fn peers(&self) -> Vec<String> {
        let st = self.status();
        st["peers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    }
}

fn wait(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A donor that lends (thresholds it always meets) and a borrower that
/// never lends, on loopback, each seeded with the other.
fn pair(dir: &Path, donor_extra: &[&str]) -> (Node, Node) {
    let (c1, c2) = (free_udp(), free_udp());
    let mut d = vec!["--insecure"];
    d.extend_from_slice(donor_extra);
    let donor = Node::start(dir, "n1", c1, &[c2], &d);
    let borrower = Node::start(
        dir,
        "n2",
        c2,
        &[c1],
        &["--insecure", "--memory", "host", "--thresholds", "0,0.01,0.985,0.99"],
    );
    wait("the donor to offer memory", 20, || donor.field("available_bytes") >= 64 << 20);
    (donor, borrower)
}

fn far(api: &Path, size: &str, hold_s: u64) -> Child {
    far_with(api, size, hold_s, &[])
}

fn far_with(api: &Path, size: &str, hold_s: u64, extra: &[&str]) -> Child {
    far_cmd(api, size, hold_s, extra).spawn().unwrap()
}

fn far_cmd(api: &Path, size: &str, hold_s: u64, extra: &[&str]) -> Command {
    let mut cmd = Command::new(MEMLEND);
    cmd.args(["far", "--insecure", "--size", size, "--local", "8M"])
        .args(["--hold-s", &hold_s.to_string(), "--pool"])
        .arg(api)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "memlend far failed:\n{text}");
    text
}

#[test]
fn a_borrower_gets_a_lease_uses_it_and_gives_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) =
        pair(dir.path(), &["--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"]);
    assert_eq!(borrower.peers(), vec!["n1"]);
    let job = far(&borrower.api, "64M", 2);
    wait("the lease", 20, || donor.field("lent_bytes") >= 64 << 20);
    let text = finish(job);
    assert!(text.contains("0 of 16384 pages differ") && text.contains("from n1"), "{text}");
    wait("the lease to end", 10, || {
        donor.field("lent_bytes") == 0 && borrower.field("borrowed_bytes") == 0
    });
    let st = borrower.status();
    assert_eq!(st["handshakes"].as_u64(), Some(1));
    let metrics = http_get(donor.metrics);
    for line in [
        "memlend_node_class{class=\"server\"} 1",
        "memlend_messages_sent_total{type=\"grant\"} 1",
        "memlend_lent_bytes 0",
    ] {
        assert!(metrics.contains(line), "metrics lack {line:?}:\n{metrics}");
    }
    let table =
        Command::new(MEMLEND).args(["status", "--api"]).arg(&borrower.api).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("n2") && table.contains("n1") && table.contains("server"), "{table}");
}

/// A program that uses 48 MiB of a 1 GiB far region holds leases for about
/// what it uses: a segment is leased when the region first writes to it,
/// not the whole region when it opens.
#[test]
fn a_region_leases_as_it_fills_not_all_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) =
        pair(dir.path(), &["--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"]);
    let ready = dir.path().join("ready");
    let script = format!(
        "import time\n\
         b = bytearray(48 << 20)\n\
         for i in range(0, len(b), 4096): b[i] = (i >> 12) & 255\n\
         open('{}', 'w').close()\n\
         time.sleep(3)\n\
         bad = sum(1 for i in range(0, len(b), 4096) if b[i] != (i >> 12) & 255)\n\
         print('bad pages:', bad)\n",
        ready.display()
    );
    let job = Command::new(MEMLEND)
        .args(["run", "--insecure", "--local", "8M", "--far", "1G", "--pool"])
        .arg(&borrower.api)
        .args(["--", "python3", "-c", &script])
        .env(memlend_borrow::env::LEASE_FIRST, "16M")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait("the program to write its memory", 60, || ready.exists());
    let lent = donor.field("lent_bytes");
    // The borrower's metrics name the program, from its live file.
    let children = format!("/proc/{0}/task/{0}/children", job.id());
    let pid = std::fs::read_to_string(children).unwrap_or_default();
    let pid = pid.split_whitespace().next().unwrap_or("none").to_string();
    let want = format!("memlend_process_far_budget_bytes{{pid=\"{pid}\"");
    wait("the program in the borrower's metrics", 5, || http_get(borrower.metrics).contains(&want));
    let text = finish(job);
    assert!(text.contains("bad pages: 0"), "{text}");
    // 48 MiB evicted through an 8 MiB budget: at least the first two
    // segments (16 + 16 MiB), and far from the 1 GiB asked for.
    assert!((32 << 20..=128 << 20).contains(&lent), "lent {} MiB:\n{text}", lent >> 20);
    println!("a program using 48 MiB of a 1 GiB region: {} MiB lent", lent >> 20);
    wait("the leases to end", 10, || donor.field("lent_bytes") == 0);
}

/// With `--layers pack`, a region leases for the bins its compressed pages
/// take, not for the pages: 96 MiB of text written through an 8 MiB budget
/// holds leases for a fraction of that (without it, 128 MiB or more: 16 +
/// 16 + 32 + 64), and every page reads back right.
#[test]
fn a_packed_region_leases_for_its_compressed_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) =
        pair(dir.path(), &["--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"]);
    let ready = dir.path().join("ready");
    let script = format!(
        "import time\n\
         n = 96 << 20\n\
         text = b'the donor lends its idle memory to the borrower ' * 90\n\
         page = lambda i: i.to_bytes(8, 'little') + text[:4088]\n\
         b = bytearray(n)\n\
         for i in range(0, n, 4096): b[i:i + 4096] = page(i >> 12)\n\
         open('{}', 'w').close()\n\
         time.sleep(3)\n\
         bad = sum(1 for i in range(0, n, 4096) if b[i:i + 4096] != page(i >> 12))\n\
         print('bad pages:', bad)\n",
        ready.display()
    );
    let job = Command::new(MEMLEND)
        .args(["run", "--insecure", "--local", "8M", "--far", "1G", "--layers", "pack", "--pool"])
        .arg(&borrower.api)
        .args(["--", "python3", "-c", &script])
        .env(memlend_borrow::env::LEASE_FIRST, "16M")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait("the program to write its memory", 60, || ready.exists());
    let lent = donor.field("lent_bytes");
    let text = finish(job);
    assert!(text.contains("bad pages: 0"), "{text}");
    assert!(text.contains("pack (Lz4)"), "no pack report:\n{text}");
    assert!((16 << 20..=48 << 20).contains(&lent), "lent {} MiB:\n{text}", lent >> 20);
    println!("96 MiB of text written, packed, over leases: {} MiB lent", lent >> 20);
    wait("the leases to end", 10, || donor.field("lent_bytes") == 0);
}

/// Every page of a region that grew lease by lease reads back right, and
/// the region ends up holding leases for all of it.
#[test]
fn a_region_that_grows_over_five_leases_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) =
        pair(dir.path(), &["--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"]);
    let mut cmd = far_cmd(&borrower.api, "256M", 2, &[]);
    let job = cmd.env(memlend_borrow::env::LEASE_FIRST, "16M").spawn().unwrap();
    // 16 + 16 + 32 + 64 + 128 MiB.
    wait("every segment's lease", 30, || donor.field("lent_bytes") >= 256 << 20);
    let text = finish(job);
    assert!(text.contains("240.0 MiB more in 4 leases as it fills"), "{text}");
    assert!(text.contains("0 of 65536 pages differ"), "{text}");
    assert_eq!(borrower.status()["handshakes"].as_u64(), Some(5), "{text}");
}

/// The donor's own memory use rises (a process in its cgroup): it reclaims,
/// and the running program's pages move home while it keeps checking them.
#[test]
fn a_reclaim_moves_a_running_programs_pages_home_with_none_lost() {
    let Some(rm) = donor_cgroup("reclaim") else { return };
    let cg = rm.0.clone();
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) = pair(dir.path(), &["--memory", cg.to_str().unwrap()]);
    // Three leases (32 + 32 + 64 MiB), the last two added as the region
    // filled: each is reclaimed and moved.
    let mut cmd = far_cmd(&borrower.api, "128M", 15, &[]);
    let job = cmd.env(memlend_borrow::env::LEASE_FIRST, "32M").spawn().unwrap();
    wait("the leases", 20, || donor.field("lent_bytes") >= 128 << 20);
    let mut hog = hog(&cg);
    wait("the donor to take its memory back", 40, || donor.field("lent_bytes") == 0);
    let text = finish(job);
    assert_eq!(text.matches("moved to home").count(), 3, "{text}");
    assert!(text.contains("0 of 32768 pages differ"), "{text}");
    assert_eq!(borrower.field("borrowed_bytes"), 0);
    let _ = hog.0.kill();
}

/// The donor reclaims with no other donor free: the pages go home, into the
/// borrower's RAM. The donor's own use then falls again, it lends again,
/// and the pages go back to it while the program keeps checking them.
#[test]
fn pages_sent_home_go_back_to_a_lease_when_the_cluster_has_room() {
    let Some(rm) = donor_cgroup("back") else { return };
    let cg = rm.0.clone();
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) = pair(dir.path(), &["--memory", cg.to_str().unwrap()]);
    let job = far(&borrower.api, "128M", 45);
    wait("the lease", 20, || donor.field("lent_bytes") >= 128 << 20);
    let mut hog = hog(&cg);
    wait("the donor to take its memory back", 40, || donor.field("lent_bytes") == 0);
    let _ = hog.0.kill();
    let _ = hog.0.wait();
    wait("the pages to go back to the donor", 40, || donor.field("lent_bytes") >= 128 << 20);
    let text = finish(job);
    assert!(text.contains("moved to home"), "{text}");

    assert!(text.contains("moved back from home"), "{text}");
    assert!(text.contains("0 of 32768 pages differ"), "{text}");
    wait("the lease to end with the program", 10, || donor.field("lent_bytes") == 0);
}

/// The donor reclaims while the borrower is stopped (SIGSTOP), so the
/// deadline passes and the lease is revoked with the pages still on it. With
/// `--redundancy ssd` every page also has a copy at home: the program, once
/// continued, reads them from there, none lost.
#[test]
fn a_reclaim_past_its_deadline_loses_nothing_with_an_ssd_copy() {
    let Some(out) = reclaim_while_stopped("ssd", &["--redundancy", "ssd"]) else { return };
    let text = output_text(&out);
    assert!(out.status.success(), "memlend far failed:\n{text}");
    assert!(text.contains("0 of 32768 pages differ"), "{text}");
    assert!(text.contains("1 legs failed") && text.contains(" 0 pages lost"), "{text}");
    let summary: Vec<&str> =
        text.lines().filter(|l| l.contains("copies:") || l.contains("reclaim")).collect();
    println!("chaos: reclaim past its deadline:\n{}", summary.join("\n"));
}

/// The same without a second copy: the pages are gone. The program must
/// learn it at once, by SIGBUS at a lost page with the reason logged, not
/// by asking the donor for a slab that no longer exists again and again.
#[test]
fn a_lease_lost_without_a_copy_is_a_sigbus_with_a_reason_not_a_hang() {
    let t = Instant::now();
    let Some(out) = reclaim_while_stopped("none", &[]) else { return };
    let text = output_text(&out);
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{text}");
    // The job may be stopped while it reads (its writes take 0.2 s now). Once
    // continued, a read can reach the donor before the reclaim thread has put
    // the lost lease's stand-in in place (NoSuchSlab); the handler tries
    // again 1, 10 and 100 ms later, by when the stand-in gives the reason.
    assert!(text.contains("store read of page") && text.contains("was lost: lease"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(90), "took {:?}", t.elapsed());
}

/// A 128 MiB far job on a lease; the job is stopped, the donor's memory is
/// taken (its reclaim deadline is 1 s), and once the donor revoked the
/// lease the job is continued. Its output when it ends; None if skipped.
fn reclaim_while_stopped(name: &str, far_args: &[&str]) -> Option<Output> {
    let rm = donor_cgroup(&format!("late-{name}"))?;
    let cg = rm.0.clone();
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--memory", cg.to_str().unwrap(), "--reclaim-deadline-ms", "1000"];
    let (donor, borrower) = pair(dir.path(), &extra);
    let ssd = dir.path().to_str().unwrap();
    let job = far_with(&borrower.api, "128M", 15, &[far_args, &["--ssd", ssd]].concat());
    let pid = job.id().to_string();
    wait("the lease", 20, || donor.field("lent_bytes") >= 128 << 20);
    std::thread::sleep(Duration::from_secs(1));
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let job = ContinueOnDrop(Some(job));
    let mut hog = hog(&cg);
    wait("the donor to revoke the lease", 40, || donor.field("lent_bytes") == 0);
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let out = job.take().wait_with_output().unwrap();
    let _ = hog.0.kill();
    Some(out)
}

fn output_text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A stopped child is continued before it is dropped, so that nothing is
/// left stopped if the test fails.
struct ContinueOnDrop(Option<Child>);

impl ContinueOnDrop {
    fn take(mut self) -> Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for ContinueOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two donors: when the first reclaims, the pages move to the other donor
/// (not home), while the program keeps checking them.
#[test]
fn a_reclaim_moves_pages_to_another_donor() {
    reclaim_to_another_donor("move", &[], false);
}

/// The same with `--redundancy ssd`, and the second donor is then killed:
/// the SSD copy sits above the lease that moves (`mirror(relocatable lease,
/// ssd)`), so it covers the new donor too, and none is lost.
#[test]
fn a_lease_that_took_reclaimed_pages_keeps_an_ssd_copy() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = ["--redundancy", "ssd", "--ssd", dir.path().to_str().unwrap()];
    reclaim_to_another_donor("move-ssd", &ssd, true);
}

fn reclaim_to_another_donor(name: &str, far_extra: &[&str], kill_second: bool) {
    let Some(rm) = donor_cgroup(name) else { return };
    let cg = rm.0.clone();
    let dir = tempfile::tempdir().unwrap();
    let (c1, c2, c3) = (free_udp(), free_udp(), free_udp());
    let first = Node::start(
        dir.path(),
        "n1",
        c1,
        &[c2, c3],
        &["--insecure", "--memory", cg.to_str().unwrap()],
    );
    let borrower = Node::start(
        dir.path(),
        "n2",
        c2,
        &[c1, c3],
        &["--insecure", "--memory", "host", "--thresholds", "0,0.01,0.985,0.99"],
    );
    wait("the first donor to offer", 20, || first.field("available_bytes") >= 128 << 20);
    let job = far_with(&borrower.api, "128M", 20, far_extra);
    wait("the lease on the first donor", 20, || first.field("lent_bytes") >= 128 << 20);
    // The second donor joins only now, so the first lease was on the first.
    let mut second = Node::start(
        dir.path(),
        "n3",
        c3,
        &[c1, c2],
        &["--insecure", "--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"],
    );
    wait("the second donor to offer", 20, || second.field("available_bytes") >= 128 << 20);
    let mut hog = hog(&cg);
    wait("the pages to reach the second donor", 40, || {
        first.field("lent_bytes") == 0 && second.field("lent_bytes") >= 128 << 20
    });
    if kill_second {
        second.child.kill().unwrap();
        second.child.wait().unwrap();
    }
    let text = finish(job);
    assert!(text.contains("moved to n3"), "{text}");
    assert!(text.contains("0 of 32768 pages differ"), "{text}");
    if kill_second {
        let _ = hog.0.kill();
        return;
    }
    let metrics = http_get(borrower.metrics);
    assert!(metrics.contains("memlend_migrations_total 1"), "{metrics}");
    assert!(http_get(first.metrics).contains("memlend_reclaims_sent_total 1"));
    wait("the second lease to end with the program", 10, || second.field("lent_bytes") == 0);
    let _ = hog.0.kill();
}

/// `--pool --redundancy mirror`: three donors in two racks. The region's
/// two copies go to donors in different racks (with only domains to tell
/// them apart: the rack-a pair is as good as the rack-b donor otherwise),
/// and killing the rack-a donor that holds one while the program runs
/// loses nothing: reads go to the other copy, and a spare copy is leased
/// on the other rack-a donor (never the rack-b one, which holds the first)
/// and filled.
#[test]
fn a_mirror_over_leases_spans_racks_and_survives_a_killed_donor() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, c2, c3, c4) = (free_udp(), free_udp(), free_udp(), free_udp());
    let donor = |name: &str, ctrl: u16, seeds: &[u16], rack: &str| {
        Node::start(dir.path(), name, ctrl, seeds, &["--insecure", "--domain", rack])
    };
    let mut a1 = donor("a1", c1, &[c2, c3, c4], "rack-a");
    let mut a2 = donor("a2", c3, &[c1, c2, c4], "rack-a");
    let b1 = donor("b1", c4, &[c1, c2, c3], "rack-b");
    let borrower = Node::start(
        dir.path(),
        "n2",
        c2,
        &[c1, c3, c4],
        &["--insecure", "--memory", "host", "--thresholds", "0,0.01,0.985,0.99"],
    );
    for d in [&a1, &a2, &b1] {
        wait("every donor to offer", 20, || d.field("available_bytes") >= 128 << 20);
    }
    let job = far_with(&borrower.api, "64M", 20, &["--redundancy", "mirror"]);
    let lent = |n: &Node| n.field("lent_bytes");
    wait("both copies to be leased", 30, || {
        lent(&b1) >= 64 << 20 && lent(&a1) + lent(&a2) >= 64 << 20
    });
    assert!(lent(&a1) == 0 || lent(&a2) == 0, "one copy per rack: {} and {}", lent(&a1), lent(&a2));
    let (held, spare) = if lent(&a1) > 0 { (&mut a1, &a2) } else { (&mut a2, &a1) };
    held.child.kill().unwrap();
    held.child.wait().unwrap();
    wait("a spare copy on the other rack-a donor", 30, || lent(spare) >= 64 << 20);
    let text = finish(job);
    assert!(text.contains("mirrored on leases from"), "{text}");
    assert!(text.contains("0 of 16384 pages differ"), "{text}");
    assert!(text.contains("1 legs failed, 1 rebuilt"), "{text}");
}

/// The donor is frozen with the borrower's request in its socket, then
/// killed: the program gets a clear "no room" instead of a hang. The donor
/// restarts under the same name and rejoins; the next borrow works, and the
/// new incarnation holds nothing of the old one.
#[test]
fn a_donor_killed_mid_handshake_then_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (c1, c2) = (free_udp(), free_udp());
    let donor_args = ["--insecure", "--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"];
    let mut donor = Node::start(dir.path(), "n1", c1, &[c2], &donor_args);
    let borrower = Node::start(
        dir.path(),
        "n2",
        c2,
        &[c1],
        &["--insecure", "--memory", "host", "--thresholds", "0,0.01,0.985,0.99"],
    );
    wait("the donor to offer", 20, || donor.field("available_bytes") >= 64 << 20);
    let pid = donor.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let t = Instant::now();
    let job = far(&borrower.api, "64M", 0);
    std::thread::sleep(Duration::from_millis(300)); // the request is in the frozen donor's socket
    donor.child.kill().unwrap();
    let _ = donor.child.wait();
    let out = job.wait_with_output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && text.contains("no donor has room"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(20), "answered in {:?}, not hung", t.elapsed());
    drop(donor);
    let donor = Node::start(dir.path(), "n1-restarted", c1, &[c2], &donor_args);
    let _ = donor; // a new name is a new node; the old one must be gone from the borrower's view
    wait("the borrower to forget the dead donor", 10, || borrower.peers() == vec!["n1-restarted"]);
    wait("the restarted donor to offer", 20, || donor.field("available_bytes") >= 64 << 20);
    let text = finish(far(&borrower.api, "64M", 0));
    assert!(
        text.contains("0 of 16384 pages differ") && text.contains("from n1-restarted"),
        "{text}"
    );
    wait("the lease to end", 10, || donor.field("lent_bytes") == 0);
}

#[test]
fn a_node_with_another_key_is_not_a_peer() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<PathBuf> = (0..2).map(|i| dir.path().join(format!("k{i}"))).collect();
    for k in &keys {
        assert!(Command::new(MEMLEND).arg("keygen").arg(k).status().unwrap().success());
    }
    let (c1, c2, c3) = (free_udp(), free_udp(), free_udp());
    let k0 = keys[0].to_str().unwrap();
    let a = Node::start(dir.path(), "a", c1, &[c2, c3], &["--key", k0]);
    let b = Node::start(dir.path(), "b", c2, &[c1, c3], &["--key", k0]);
    let _stranger =
        Node::start(dir.path(), "x", c3, &[c1, c2], &["--key", keys[1].to_str().unwrap()]);
    wait("a and b to meet", 10, || a.peers() == vec!["b"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(a.peers(), vec!["b"], "the stranger is never a peer");
    assert_eq!(b.peers(), vec!["a"]);
}

/// The borrower's daemon dies: its donor frees the lease by itself.
#[test]
fn a_dead_borrower_strands_no_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (donor, mut borrower) =
        pair(dir.path(), &["--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"]);
    let job = KillOnDrop(far(&borrower.api, "64M", 30));
    wait("the lease", 20, || donor.field("lent_bytes") >= 64 << 20);
    borrower.child.kill().unwrap();
    let _ = borrower.child.wait();
    let t = Instant::now();
    wait("the donor to free the lease", 15, || donor.field("lent_bytes") == 0);
    eprintln!("dead borrower's lease freed after {} ms", t.elapsed().as_millis());
    // The lease can end a moment before the sweep drops the node: wait.
    wait("the dead node to leave the membership", 10, || donor.peers().is_empty());
    drop(job);
}

fn http_get(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes a test cgroup on every exit path (after moving stragglers out).
/// A cgroup of 1 GiB whose use a donor watches (`--memory`); removed on
/// every exit path. None (the test skips) without root or cgroup v1.
fn donor_cgroup(name: &str) -> Option<RmCgroup> {
    let why = match () {
        _ if !is_root() => "not root",
        _ if !Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() => "no cgroup v1",
        _ => "",
    };
    if !why.is_empty() {
        memlend_testskip::skip(why);
        return None;
    }
    let id = std::process::id();
    let cg = PathBuf::from(format!("/sys/fs/cgroup/memory/memlend-test-{name}-{id}"));
    std::fs::create_dir_all(&cg).unwrap();
    let rm = RmCgroup(cg.clone());
    std::fs::write(cg.join("memory.limit_in_bytes"), "1073741824").unwrap();
    Some(rm)
}

/// 700 MiB of the donor's own use, in its cgroup: it must reclaim.
fn hog(cg: &Path) -> KillOnDrop {
    let script = format!("echo $$ > {}/cgroup.procs; exec python3 -c 'import time; b=bytearray(700<<20); time.sleep(60)'", cg.display());
    KillOnDrop(Command::new("sh").args(["-c", &script]).spawn().unwrap())
}

struct RmCgroup(PathBuf);

impl Drop for RmCgroup {
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// ACMS Figure 6 in the lab: classes change as expected without
/// oscillating, every page verifies, no lease is left (the script asserts
/// all of it, draws the plot, and exits non-zero on any failure).
#[test]
fn acms_figure6_scenario_in_the_lab() {
    figure6(&["--prefix", "f6", "--subnet", "10.78.0.0/24"]);
}

/// The same story with 5% of control datagrams lost at every node, and
/// every packet (control and data) held 20 ms by its receiver: a round trip
/// of 40 ms (`memlend lab netem`).
#[test]
fn acms_figure6_scenario_with_5pct_control_loss_and_20ms_delay() {
    let args = ["--prefix", "f6l", "--subnet", "10.79.0.0/24", "--loss-pct", "5"];
    figure6(&[&args[..], &["--delay-ms", "20"]].concat());
}

fn figure6(args: &[&str]) {
    let python = Path::new("/usr/bin/python3");
    let why = match () {
        _ if !is_root() => "not root",
        _ if !python.exists() => "no /usr/bin/python3",
        _ if Command::new("ip").arg("-V").output().is_err() => "no `ip` (iproute2)",
        _ => "",
    };
    if !why.is_empty() {
        return memlend_testskip::skip(why);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(python)
        .arg(root.join("bench/acms_fig6.py"))
        .arg("--out")
        .arg(out.path())
        .args(args)
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "the Figure 6 scenario failed:\n{text}");
    assert!(
        out.path().join("acms_fig6.png").exists() && out.path().join("acms_fig6.json").exists()
    );
}

/// Datagrams a real daemon must drop: garbage, a forgery (another key), a
/// replay of a genuine one, another cluster's. The genuine one makes a peer;
/// nothing else changes anything. Counted by why in its status.
#[test]
fn forged_replayed_and_malformed_datagrams_are_dropped_and_counted() {
    use memlend_wire::ctrl::{
        encode, Body, CtrlKey, Envelope, Heartbeat, NodeClass, DATAGRAM_BYTES_MAX,
    };
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("k");
    assert!(Command::new(MEMLEND).arg("keygen").arg(&key_path).status().unwrap().success());
    let hex = std::fs::read_to_string(&key_path).unwrap();
    let raw: Vec<u8> =
        (0..32).map(|i| u8::from_str_radix(&hex.trim()[2 * i..2 * i + 2], 16).unwrap()).collect();
    let raw: [u8; 32] = raw.try_into().unwrap();
    let ctrl = free_udp();
    let node = Node::start(dir.path(), "d", ctrl, &[], &["--key", key_path.to_str().unwrap()]);
    let hb = |name: &str| Heartbeat {
        name: name.into(),
        class: NodeClass::Neutral,
        total_bytes: 1 << 30,
        used_bytes: 0,
        lent_bytes: 0,
        borrowed_bytes: 0,
        available_bytes: 0,
        data_addr: "127.0.0.1:1".parse().unwrap(),
        leases: vec![],
        domain: String::new(),
        peers: vec![],
    };
    let datagram = |key: &CtrlKey, cluster: u64, sender: u64, counter: u64, name: &str| {
        let env = Envelope {
            cluster_id: cluster,
            sender,
            incarnation: 1,
            counter,
            body: Body::Heartbeat(hb(name)),
        };
        let mut buf = [0u8; DATAGRAM_BYTES_MAX];
        let n = encode(&env, key, &mut buf).unwrap();
        buf[..n].to_vec()
    };
    let (good_key, cluster) = (CtrlKey::new(&raw), memlend_wire::ctrl::cluster_id_from_key(&raw));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = ("127.0.0.1", ctrl);
    let genuine = datagram(&good_key, cluster, 42, 1, "real");
    sock.send_to(&genuine, to).unwrap();
    sock.send_to(&genuine, to).unwrap(); // a replay
    sock.send_to(&datagram(&CtrlKey::new(&[1; 32]), cluster, 43, 1, "forger"), to).unwrap();
    sock.send_to(&datagram(&good_key, cluster ^ 1, 44, 1, "foreign"), to).unwrap();
    sock.send_to(b"MLCT garbage that is not a datagram at all, padded out to length", to).unwrap();
    let mut flipped = datagram(&good_key, cluster, 45, 1, "flipped");
    flipped[30] ^= 4;
    sock.send_to(&flipped, to).unwrap();
    let count = |what: &str| -> u64 {
        let st = node.status();
        let v = st["datagrams"].as_array().unwrap().iter().find(|d| d[0] == what).unwrap()[1]
            .as_u64()
            .unwrap();
        v
    };
    wait("the daemon to read them all", 10, || count("received") >= 6);
    assert_eq!(node.peers(), vec!["real"], "only the genuine sender is a peer");
    assert_eq!(count("replayed"), 1);
    assert_eq!(count("foreign"), 1);
    assert_eq!(count("rejected"), 3, "forgery, garbage and the flipped bit");
}

/// Bad input on the local API: an oversize want and a release of another
/// process's lease get clear errors and change nothing; a garbage line ends
/// only that connection; the daemon serves on.
#[test]
fn the_local_api_refuses_bad_asks_and_serves_on() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let dir = tempfile::tempdir().unwrap();
    let (donor, borrower) =
        pair(dir.path(), &["--memory", "host", "--thresholds", "0.97,0.98,0.985,0.99"]);
    let open = || {
        let s = UnixStream::connect(&borrower.api).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (BufReader::new(s.try_clone().unwrap()), s)
    };
    let line = |r: &mut BufReader<UnixStream>| {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        serde_json::from_str::<Value>(&l).unwrap()
    };
    let (mut r1, mut w1) = open();
    writeln!(w1, r#"{{"want":{{"bytes":16777216}}}}"#).unwrap();
    let lease = line(&mut r1)["lease"].clone();
    assert!(lease["lease"].is_u64(), "{lease}");
    let (mut r2, mut w2) = open();
    writeln!(w2, r#"{{"want":{{"bytes":18446744073709551615}}}}"#).unwrap();
    assert!(line(&mut r2)["error"]["message"].as_str().unwrap().contains("over the limit"));
    writeln!(w2, r#"{{"home":{{"bytes":18446744073709551615}}}}"#).unwrap();
    assert!(line(&mut r2)["error"]["message"].as_str().unwrap().contains("over the limit"));
    writeln!(w2, r#"{{"release":{{"donor":{},"lease":{}}}}}"#, lease["donor"], lease["lease"])
        .unwrap();
    assert!(line(&mut r2)["error"]["message"].as_str().unwrap().contains("not yours"));
    assert_eq!(donor.field("lent_bytes"), 16 << 20, "the lease is still there");
    writeln!(w2, "this is not json").unwrap();
    let mut rest = String::new();
    assert_eq!(r2.read_line(&mut rest).unwrap(), 0, "the garbage sender is disconnected");
    // The first process is unaffected; its lease ends with its connection.
    assert_eq!(borrower.field("borrowed_bytes"), 16 << 20);
    drop((r1, w1));
    wait("the lease to end with its process", 10, || donor.field("lent_bytes") == 0);
}
